package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Version is the cgroup hierarchy a Group lives in.
type Version int

const (
	V1 Version = 1
	V2 Version = 2
)

// ErrNoMemoryController: neither hierarchy has the memory controller.
var ErrNoMemoryController = errors.New("cgroup: no memory controller (neither cgroup v2 with memory nor v1 memory is mounted)")

// ErrName: a group name that is empty or not a single path element.
var ErrName = errors.New("cgroup: invalid group name")

// Mounts of the hierarchies; variables so tests could point elsewhere.
var (
	v2Roots = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}
	v1Root  = "/sys/fs/cgroup/memory"
)

// Detect returns the hierarchy to use and its root directory: the first v2
// root whose cgroup.controllers lists memory, else the v1 memory mount.
func Detect() (Version, string, error) {
	for _, r := range v2Roots {
		b, err := os.ReadFile(filepath.Join(r, "cgroup.controllers"))
		if err == nil && hasWord(string(b), "memory") {
			return V2, r, nil
		}
	}
	if _, err := os.Stat(filepath.Join(v1Root, "memory.limit_in_bytes")); err == nil {
		return V1, v1Root, nil
	}
	return 0, "", ErrNoMemoryController
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

// Group is a memory cgroup.
type Group struct {
	Version Version
	Path    string // its directory
}

// Create makes the group name (one path element) under the detected
// hierarchy's root and limits its resident memory to limit bytes.
// It fails with an error wrapping EEXIST if the group exists.
func Create(name string, limit uint64) (*Group, error) {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return nil, fmt.Errorf("%w: %q", ErrName, name)
	}
	v, root, err := Detect()
	if err != nil {
		return nil, err
	}
	g := &Group{Version: v, Path: filepath.Join(root, name)}
	if v == V2 {
		// The parent must hand the memory controller down.
		if err := write(filepath.Join(root, "cgroup.subtree_control"), "+memory"); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(g.Path, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: create %s: %w", g.Path, err)
	}
	if err := g.SetLimit(limit); err != nil {
		os.Remove(g.Path)
		return nil, err
	}
	return g, nil
}

// Open returns the existing group at path (a directory of a hierarchy).
func Open(path string) (*Group, error) {
	if _, err := os.Stat(filepath.Join(path, "memory.limit_in_bytes")); err == nil {
		return &Group{Version: V1, Path: path}, nil
	}
	if _, err := os.Stat(filepath.Join(path, "memory.max")); err == nil {
		return &Group{Version: V2, Path: path}, nil
	}
	return nil, fmt.Errorf("cgroup: %s is not a memory cgroup", path)
}

func write(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", v, path, err)
	}
	return nil
}

// SetLimit limits the group's resident memory to limit bytes.
func (g *Group) SetLimit(limit uint64) error {
	if limit == 0 {
		return fmt.Errorf("cgroup: limit 0")
	}
	file := "memory.max"
	if g.Version == V1 {
		file = "memory.limit_in_bytes"
	}
	return write(filepath.Join(g.Path, file), strconv.FormatUint(limit, 10))
}

// ProcsFile is the file a process writes its pid into to join the group.
func (g *Group) ProcsFile() string { return filepath.Join(g.Path, "cgroup.procs") }

// Attach moves the process pid (all its threads) into the group.
func (g *Group) Attach(pid int) error {
	return write(g.ProcsFile(), strconv.Itoa(pid))
}

// Procs returns the pids in the group.
func (g *Group) Procs() ([]int, error) {
	b, err := os.ReadFile(g.ProcsFile())
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var pids []int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pid, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
		if err != nil {
			return nil, fmt.Errorf("cgroup: %s: bad pid %q", g.ProcsFile(), sc.Text())
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// Usage is the group's memory accounting.
type Usage struct {
	Current uint64 // bytes charged now
	Peak    uint64 // highest charge (v1 max_usage_in_bytes, v2 memory.peak; 0 if unknown)
	Swap    uint64 // bytes of the group's memory in swap (from memory.stat)
}

// Usage reads the group's accounting.
func (g *Group) Usage() (Usage, error) {
	cur, peak, swapKey := "memory.current", "memory.peak", "swap"
	if g.Version == V1 {
		cur, peak, swapKey = "memory.usage_in_bytes", "memory.max_usage_in_bytes", "swap"
	}
	var u Usage
	var err error
	if u.Current, err = readUint(filepath.Join(g.Path, cur)); err != nil {
		return u, err
	}
	u.Peak, _ = readUint(filepath.Join(g.Path, peak))
	st, err := os.ReadFile(filepath.Join(g.Path, "memory.stat"))
	if err != nil {
		return u, fmt.Errorf("cgroup: %w", err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == swapKey {
			u.Swap, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	if g.Version == V2 {
		u.Swap, _ = readUint(filepath.Join(g.Path, "memory.swap.current"))
	}
	return u, nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %s: %w", path, err)
	}
	return v, nil
}

// Remove kills the processes left in the group (SIGKILL), waits up to
// timeout for them to leave, and removes the group. Removing a group that
// does not exist is not an error.
func (g *Group) Remove(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := g.Procs()
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			err := os.Remove(g.Path)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("cgroup: remove %s: %w", g.Path, err)
			}
		} else if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: remove %s: processes %v still in it after %v", g.Path, pids, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stat returns the counters of the group's memory.stat (v1 and v2 name
// them differently: v1 pgpgin/pgpgout/swap, v2 pswpin/pswpout/...).
func (g *Group) Stat() (map[string]uint64, error) {
	b, err := os.ReadFile(filepath.Join(g.Path, "memory.stat"))
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return ParseStat(b)
}

// ParseStat decodes memory.stat: lines "key value".
func ParseStat(b []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		k, v, ok := strings.Cut(l, " ")
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if !ok || k == "" || err != nil {
			return nil, fmt.Errorf("cgroup: memory.stat: bad line %q", l)
		}
		out[k] = n
	}
	return out, nil
}
