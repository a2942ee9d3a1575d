package swaprun

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"rmem/internal/swapdev"
	"rmem/swapfs"
)

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	Point  string
	FSType string
}

// ParseMountinfo decodes the content of /proc/PID/mountinfo.
func ParseMountinfo(b []byte) ([]Mount, error) {
	var out []Mount
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 {
			return nil, fmt.Errorf("swaprun: mountinfo: bad line %q", l)
		}
		out = append(out, Mount{Point: swapdev.UnescapePath(f[4]), FSType: g[0]})
	}
	return out, nil
}

func mounts() ([]Mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("swaprun: %w", err)
	}
	return ParseMountinfo(b)
}

// SwapMounted reports whether dir is a pool swap filesystem mount.
func SwapMounted(dir string) (bool, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	ms, err := mounts()
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.Point == dir && m.FSType == swapfs.FSType {
			return true, nil
		}
	}
	return false, nil
}

// ActivePoolSwaps returns the pool swap files in use as swap: loop devices
// active in /proc/swaps whose backing file is on a pool swap mount.
func ActivePoolSwaps() ([]string, error) {
	ms, err := mounts()
	if err != nil {
		return nil, err
	}
	pool := map[string]bool{}
	for _, m := range ms {
		if m.FSType == swapfs.FSType {
			pool[m.Point] = true
		}
	}
	loops, err := swapdev.Loops()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range loops {
		if !pool[filepath.Dir(l.Backing)] {
			continue
		}
		if _, on, err := swapdev.Active(l.Device); err != nil {
			return nil, err
		} else if on {
			out = append(out, l.Backing)
		}
	}
	return out, nil
}
