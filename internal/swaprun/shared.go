package swaprun

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// Runs on one host share the pool swap: the kernel's swap is global, so a
// run that finds a pool swap file active uses it, and the swap file a run
// set up is torn down by the last run to end, not by the one that set it
// up (that would swap the other runs' pages back in under their cgroup
// limits). The bookkeeping is a small JSON file in the runtime directory,
// read and written under an flock of a lock file beside it.

// State is the shared bookkeeping of the runs on this host.
type State struct {
	// Swaps are the pool swap files that runs set up and that the last
	// run tears down.
	Swaps []OwnedSwap `json:"swaps"`
	// Runs are the runs in progress (or that were, until someone notices
	// their process is gone).
	Runs []RunEntry `json:"runs"`
}

// RunEntry is a run, recorded before it creates anything.
type RunEntry struct {
	PID int `json:"pid"`
	// Start is the process's start time (/proc/PID/stat, clock ticks since
	// boot): it tells the run from a later process given the same pid. 0:
	// unknown (the pid alone decides).
	Start uint64 `json:"start,omitempty"`
	// Group is the directory of its memory cgroup.
	Group string `json:"cgroup,omitempty"`
}

// UnmarshalJSON also reads a bare pid, the format of earlier versions.
func (r *RunEntry) UnmarshalJSON(b []byte) error {
	var pid int
	if err := json.Unmarshal(b, &pid); err == nil {
		*r = RunEntry{PID: pid}
		return nil
	}
	type plain RunEntry
	return json.Unmarshal(b, (*plain)(r))
}

// OwnedSwap is a pool swap file set up by a run.
type OwnedSwap struct {
	Dir   string `json:"dir"`             // mount point
	PID   int    `json:"pid"`             // of its `memagent mount` daemon
	Start uint64 `json:"start,omitempty"` // the daemon's start time (see RunEntry.Start)
	Made  bool   `json:"made"`            // Dir was created by the run (removed at teardown)
	Run   int    `json:"run,omitempty"`   // pid of the run that set it up
}

// ParseState decodes the state file; empty input is the empty state.
func ParseState(b []byte) (State, error) {
	var st State
	if len(b) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, fmt.Errorf("swaprun: state: %w", err)
	}
	for _, s := range st.Swaps {
		if !filepath.IsAbs(s.Dir) || s.PID <= 0 {
			return State{}, fmt.Errorf("swaprun: state: bad swap entry %+v", s)
		}
	}
	for _, r := range st.Runs {
		if r.PID <= 0 || r.Group != "" && !filepath.IsAbs(r.Group) {
			return State{}, fmt.Errorf("swaprun: state: bad run entry %+v", r)
		}
	}
	return st, nil
}

// shared is the locked state file.
type shared struct {
	lock  *os.File
	path  string
	State State
	// dead are the runs whose process is gone, taken out of State.Runs:
	// what they left is for reap.
	dead []RunEntry
}

// lockShared takes the runs' lock in dir and reads the state, moving runs
// whose process is gone (a run that was killed) from State.Runs to dead.
func lockShared(dir string) (*shared, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("swaprun: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "swaprun.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("swaprun: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("swaprun: lock %s: %w", f.Name(), err)
	}
	sh := &shared{lock: f, path: filepath.Join(dir, "swaprun.json")}
	b, err := os.ReadFile(sh.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		sh.unlock()
		return nil, fmt.Errorf("swaprun: %w", err)
	}
	if sh.State, err = ParseState(b); err != nil {
		sh.unlock()
		return nil, err
	}
	sh.State.Runs = slices.DeleteFunc(sh.State.Runs, func(r RunEntry) bool {
		if alive(r.PID, r.Start) {
			return false
		}
		sh.dead = append(sh.dead, r)
		return true
	})
	return sh, nil
}

// liveRuns returns the pids of the runs in progress.
func (sh *shared) liveRuns() []int {
	var pids []int
	for _, r := range sh.State.Runs {
		pids = append(pids, r.PID)
	}
	return pids
}

// save writes the state and releases the lock.
func (sh *shared) save() error {
	defer sh.unlock()
	return sh.write()
}

// write writes the state (atomically), keeping the lock.
func (sh *shared) write() error {
	b, err := json.Marshal(sh.State)
	if err != nil {
		return err
	}
	tmp := sh.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("swaprun: %w", err)
	}
	if err := os.Rename(tmp, sh.path); err != nil {
		return fmt.Errorf("swaprun: %w", err)
	}
	return nil
}

func (sh *shared) unlock() {
	unix.Flock(int(sh.lock.Fd()), unix.LOCK_UN)
	sh.lock.Close()
}
