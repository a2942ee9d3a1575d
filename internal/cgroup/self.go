package cgroup

import (
	"fmt"
	"os"
	"strings"
)

// ParseMemoryCgroup returns the memory cgroup path in the content of
// /proc/PID/cgroup: that of the v1 memory controller if it is listed, else
// that of the v2 hierarchy ("0::PATH").
func ParseMemoryCgroup(b []byte) (string, error) {
	v2, found := "", false
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			return "", fmt.Errorf("cgroup: /proc/PID/cgroup: bad line %q", l)
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return parts[2], nil
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			v2, found = parts[2], true
		}
	}
	if !found {
		return "", fmt.Errorf("cgroup: /proc/PID/cgroup: no memory controller and no v2 line")
	}
	return v2, nil
}

// Self returns the memory cgroup path of the calling process, relative to
// its hierarchy's root (e.g. "/" or "/rmem-run-42").
func Self() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	return ParseMemoryCgroup(b)
}
