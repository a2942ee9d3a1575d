package memserver

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MemInfo is what /proc/meminfo says about memory, in bytes.
type MemInfo struct {
	Total, Available uint64
	HugePagesFree    uint64 // free 2 MiB hugetlbfs pages, in pages
	HugePageSize     uint64
}

// ReadMemInfo parses /proc/meminfo.
func ReadMemInfo() (MemInfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return MemInfo{}, fmt.Errorf("memserver: %w", err)
	}
	defer f.Close()
	return parseMemInfo(bufio.NewScanner(f))
}

func parseMemInfo(sc *bufio.Scanner) (MemInfo, error) {
	var mi MemInfo
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n *= 1024
		}
		switch name {
		case "MemTotal":
			mi.Total = n
		case "MemAvailable":
			mi.Available = n
		case "HugePages_Free":
			mi.HugePagesFree = n
		case "Hugepagesize":
			mi.HugePageSize = n
		}
	}
	if err := sc.Err(); err != nil {
		return mi, fmt.Errorf("memserver: /proc/meminfo: %w", err)
	}
	if mi.Total == 0 {
		return mi, errors.New("memserver: /proc/meminfo has no MemTotal")
	}
	return mi, nil
}

// ErrMemory is wrapped by errors about memory this host cannot give.
var ErrMemory = errors.New("memserver: not enough memory")

// CheckMemory verifies that capacity bytes can be allocated and, if lock,
// mlock'ed: at most MemAvailable, and within RLIMIT_MEMLOCK unless the
// process may lock without limit (root / CAP_IPC_LOCK); it raises the soft
// limit to the hard one when that suffices.
func CheckMemory(capacity uint64, lock bool) error {
	mi, err := ReadMemInfo()
	if err != nil {
		return err
	}
	if capacity > mi.Available {
		return fmt.Errorf("%w: capacity %d bytes (%.2f GiB) is larger than the free memory, MemAvailable %d bytes (%.2f GiB): lower --capacity",
			ErrMemory, capacity, gib(capacity), mi.Available, gib(mi.Available))
	}
	if !lock || os.Geteuid() == 0 {
		return nil
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return fmt.Errorf("memserver: getrlimit RLIMIT_MEMLOCK: %w", err)
	}
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur >= capacity {
		return nil
	}
	if rl.Max == unix.RLIM_INFINITY || rl.Max >= capacity {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: mlock of %d bytes (%.2f GiB) needs RLIMIT_MEMLOCK of at least that, the limit is %d bytes (hard %d): raise it (ulimit -l, LimitMEMLOCK=infinity in the systemd unit) or run as root",
		ErrMemory, capacity, gib(capacity), rl.Cur, rl.Max)
}

func gib(n uint64) float64 { return float64(n) / (1 << 30) }
