package swaprun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/internal/cgroup"
	"rmem/internal/swapdev"
	"rmem/swapfs"
)

// What a run leaves when it is killed (SIGKILL: no deferred teardown)
// and who removes it:
//
//   - its command: killed with it (PR_SET_PDEATHSIG SIGKILL, set in the
//     child before exec), so nothing of a dead run still uses its swap;
//     what the command forked stays in the cgroup until reap kills it;
//   - its cgroup and state entry: removed by the next run to start or end
//     and by Cleanup (`memagent cleanup`), which kill what is left in the
//     cgroup first;
//   - the pool swap file it set up (loop device, swap area, mount,
//     daemon): torn down by the same, once no live run remains — never
//     under a live run, whose pages it may hold.

// Cleaned is what a Cleanup (or a run's own clean-up) did: one line per
// thing removed, and why something was left.
type Cleaned struct {
	Removed []string
	Kept    []string
}

// CleanupOptions configure Cleanup.
type CleanupOptions struct {
	RuntimeDir string // default /run/rmem
	Log        *zap.Logger
}

// Cleanup removes what dead runs left on this host: the cgroups of runs
// whose process is gone (killing what is still in them), cgroups named
// rmem-run-PID of a dead PID that the state does not list, and, when no
// run is in progress, every pool swap file that runs set up. It returns
// what it removed and what it kept.
func Cleanup(o CleanupOptions) (Cleaned, error) {
	if o.RuntimeDir == "" {
		o.RuntimeDir = "/run/rmem"
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	sh, err := lockShared(o.RuntimeDir)
	if err != nil {
		return Cleaned{}, err
	}
	c, rerr := sh.reap(nil, o.Log)
	return c, errors.Join(rerr, sh.save())
}

// reap removes what the dead runs left (see Cleanup); own is the swap file
// the calling run set up, stopped through its process rather than found.
// The caller holds the lock and saves the state afterwards.
func (sh *shared) reap(own *swap, log *zap.Logger) (Cleaned, error) {
	var c Cleaned
	var errs []error
	groupsGone := true
	for _, r := range sh.dead {
		if r.Group == "" {
			continue
		}
		n, err := removeGroup(r.Group)
		switch {
		case err != nil:
			errs = append(errs, err)
			groupsGone = false
		case n >= 0:
			c.Removed = append(c.Removed, fmt.Sprintf("cgroup %s of dead run %d (%d processes killed)", r.Group, r.PID, n))
		}
	}
	sh.dead = nil
	orphans, err := sh.orphanGroups()
	errs = append(errs, err)
	for _, path := range orphans {
		n, err := removeGroup(path)
		switch {
		case err != nil:
			errs = append(errs, err)
			groupsGone = false
		case n >= 0:
			c.Removed = append(c.Removed, fmt.Sprintf("cgroup %s of a dead run not in the state (%d processes killed)", path, n))
		}
	}

	runs := sh.liveRuns()
	switch {
	case len(sh.State.Swaps) == 0:
	case len(runs) > 0:
		for _, s := range sh.State.Swaps {
			c.Kept = append(c.Kept, fmt.Sprintf("swap %s: in use by runs %v", s.Dir, runs))
		}
	case !groupsGone:
		// A dead run's process could still hold pages there.
		for _, s := range sh.State.Swaps {
			c.Kept = append(c.Kept, fmt.Sprintf("swap %s: a dead run's cgroup could not be removed", s.Dir))
		}
	default:
		// A swap file that fails to come down stays listed: the next
		// clean-up tries again.
		var left []OwnedSwap
		for _, s := range sh.State.Swaps {
			var what string
			var err error
			if own != nil && s.Dir == own.dir {
				what, err = "swap "+s.Dir+" of this run", own.stop()
			} else {
				what, err = teardown(s, log)
			}
			if err != nil {
				errs = append(errs, err)
				left = append(left, s)
				continue
			}
			c.Removed = append(c.Removed, what)
		}
		sh.State.Swaps = left
	}
	for _, r := range c.Removed {
		log.Info("removed", zap.String("what", r))
	}
	return c, errors.Join(errs...)
}

// orphanGroups returns the cgroups rmem-run-PID whose PID is no process
// and is no live run in the state: left by a run killed before it
// recorded itself, or by an older memagent. One whose PID runs is kept:
// it may be a run of an older memagent.
func (sh *shared) orphanGroups() ([]string, error) {
	_, root, err := cgroup.Detect()
	if err != nil {
		return nil, nil // no memory cgroups: nothing a run could leave
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("swaprun: %w", err)
	}
	var out []string
	for _, e := range ents {
		v, ok := strings.CutPrefix(e.Name(), GroupPrefix)
		pid, err := strconv.Atoi(v)
		if !ok || err != nil || !e.IsDir() {
			continue
		}
		path := filepath.Join(root, e.Name())
		live := slices.ContainsFunc(sh.State.Runs, func(r RunEntry) bool { return r.PID == pid || r.Group == path })
		if !live && !alive(pid, 0) {
			out = append(out, path)
		}
	}
	return out, nil
}

// removeGroup kills the processes in the cgroup at path and removes it.
// It returns how many it killed, or -1 if there was no such group.
func removeGroup(path string) (int, error) {
	g, err := cgroup.Open(path)
	if err != nil {
		if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
			return -1, nil
		}
		return 0, err
	}
	pids, _ := g.Procs()
	if err := g.Remove(10 * time.Second); err != nil {
		return 0, err
	}
	return len(pids), nil
}

// teardown turns off a pool swap file set up by another run (or a dead
// one), unmounts it and waits for its daemon to end; it kills a daemon
// that does not. It returns what it did.
func teardown(s OwnedSwap, log *zap.Logger) (string, error) {
	var did []string
	file := filepath.Join(s.Dir, swapfs.SwapName)
	loops, _ := swapdev.LoopsOf(file)
	if err := swapdev.Off(context.Background(), file); err != nil && !errors.Is(err, swapdev.ErrNotSwap) {
		return "", err
	}
	for _, l := range loops {
		did = append(did, l.Device+" swapped off and detached")
	}
	mounted, err := SwapMounted(s.Dir)
	if err != nil {
		return "", err
	}
	if mounted {
		if err := unix.Unmount(s.Dir, 0); err != nil {
			return "", fmt.Errorf("swaprun: umount %s: %w", s.Dir, err)
		}
		did = append(did, "unmounted")
	}
	// Unmounting ends the daemon's serving loop; it then ends its lease
	// and exits. A daemon that had not mounted yet (its run was killed
	// while starting it) is told to stop.
	if alive(s.PID, s.Start) {
		if !mounted && s.Start != 0 {
			syscall.Kill(s.PID, syscall.SIGTERM)
		}
		deadline := time.Now().Add(15 * time.Second)
		for alive(s.PID, s.Start) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if s.Start != 0 && alive(s.PID, s.Start) {
			syscall.Kill(s.PID, syscall.SIGKILL)
			did = append(did, fmt.Sprintf("daemon %d killed", s.PID))
		} else {
			did = append(did, fmt.Sprintf("daemon %d ended", s.PID))
		}
	}
	if s.Made {
		os.Remove(s.Dir)
	}
	what := "swap " + s.Dir
	if len(did) > 0 {
		what += " (" + strings.Join(did, ", ") + ")"
	}
	log.Info("pool swap torn down", zap.String("dir", s.Dir), zap.Int("daemon", s.PID))
	return what, nil
}
