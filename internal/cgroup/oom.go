package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrNotSupported: the operation does not exist in the group's hierarchy.
var ErrNotSupported = errors.New("cgroup: not supported by this cgroup version")

// SetOOMKill turns the kernel's OOM killer on or off for the group (v1
// memory.oom_control). With it off, a process that cannot be charged
// waits until memory is uncharged — for example when its pages finish
// being written to swap — instead of being killed: v1 reclaim does not
// throttle on swap writeback and kills processes that a slow swap device
// would have served a moment later. v2 has no such switch
// (ErrNotSupported): memory.high throttles there.
func (g *Group) SetOOMKill(enabled bool) error {
	if g.Version != V1 {
		return ErrNotSupported
	}
	v := "1"
	if enabled {
		v = "0"
	}
	return write(filepath.Join(g.Path, "memory.oom_control"), v)
}

// UnderOOM reports whether processes of the group are waiting because it
// is out of memory with the OOM killer off (v1).
func (g *Group) UnderOOM() (bool, error) {
	if g.Version != V1 {
		return false, ErrNotSupported
	}
	b, err := os.ReadFile(filepath.Join(g.Path, "memory.oom_control"))
	if err != nil {
		return false, fmt.Errorf("cgroup: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == "under_oom" {
			return strings.TrimSpace(v) == "1", nil
		}
	}
	return false, fmt.Errorf("cgroup: %s/memory.oom_control has no under_oom", g.Path)
}

// OOMKills returns how many processes of the group the kernel's OOM killer
// has killed (v1 memory.oom_control oom_kill, v2 memory.events oom_kill).
func (g *Group) OOMKills() (uint64, error) {
	file := "memory.events"
	if g.Version == V1 {
		file = "memory.oom_control"
	}
	b, err := os.ReadFile(filepath.Join(g.Path, file))
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == "oom_kill" {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("cgroup: %s/%s has no oom_kill", g.Path, file)
}

// Nudge makes the kernel reclaim from the group and wake its processes
// waiting under OOM (v1): it lowers the limit by a page and sets it back.
// In v1 a process waiting under OOM is woken only when a page of the group
// is uncharged or the limit raised, not when the writeback that would let
// reclaim free a page completes: without a nudge it can sleep at its limit
// with reclaimable memory, indefinitely. Lowering the limit reclaims (an
// uncharge wakes the waiters); where nothing can be reclaimed (swap full)
// it fails with EBUSY and changes nothing, which is not an error of Nudge.
// It grants the group no memory.
func (g *Group) Nudge() error {
	if g.Version != V1 {
		return ErrNotSupported
	}
	file := filepath.Join(g.Path, "memory.limit_in_bytes")
	limit, err := readUint(file)
	if err != nil {
		return err
	}
	if limit <= 2*4096 {
		return nil
	}
	err = write(file, strconv.FormatUint(limit-4096, 10))
	if err != nil && !errors.Is(err, syscall.EBUSY) {
		return err
	}
	return write(file, strconv.FormatUint(limit, 10))
}
