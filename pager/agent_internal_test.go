package pager

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Who the agent serves: root, its own user, AllowUIDs, and processes that
// have SocketGroup as their primary or a supplementary group.
func TestAllowed(t *testing.T) {
	opts := &Options{AllowUIDs: []uint32{1000}, SocketGroup: 4242}
	const self, member, gone = 10, 11, 12
	groups := func(pid int) ([]int, error) {
		switch pid {
		case self:
			return []int{7}, nil
		case member:
			return []int{7, 4242}, nil
		}
		return nil, os.ErrNotExist
	}
	cases := []struct {
		name string
		cred unix.Ucred
		want bool
	}{
		{"root", unix.Ucred{Pid: self, Uid: 0, Gid: 0}, true},
		{"own user", unix.Ucred{Pid: self, Uid: 3000}, true},
		{"allowed uid", unix.Ucred{Pid: self, Uid: 1000, Gid: 1000}, true},
		{"primary group", unix.Ucred{Pid: self, Uid: 2000, Gid: 4242}, true},
		{"supplementary group", unix.Ucred{Pid: member, Uid: 2000, Gid: 2000}, true},
		{"stranger", unix.Ucred{Pid: self, Uid: 2000, Gid: 2000}, false},
		{"gone process", unix.Ucred{Pid: gone, Uid: 2000, Gid: 2000}, false},
	}
	for _, c := range cases {
		if got := allowed(&c.cred, opts, 3000, groups); got != c.want {
			t.Errorf("%s: allowed(%+v) = %v, want %v", c.name, c.cred, got, c.want)
		}
	}
	if allowed(&unix.Ucred{Pid: member, Uid: 2000, Gid: 2000}, &Options{}, 3000, groups) {
		t.Errorf("a process of uid 2000 is served without SocketGroup")
	}
	t.Run("real process", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to start a process with other groups")
		}
		a := &Agent{opts: *opts}
		// A process of another user with the group as a supplementary one.
		cmd := exec.Command("sleep", "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 2000, Gid: 2000, Groups: []uint32{7, 4242}}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
		if m := (unix.Ucred{Pid: int32(cmd.Process.Pid), Uid: 2000, Gid: 2000}); !a.allowed(&m) {
			t.Errorf("a process with supplementary group 4242 is refused")
		}
		if s := (unix.Ucred{Pid: int32(os.Getpid()), Uid: 2000, Gid: 2000}); a.allowed(&s) != (os.Geteuid() == 2000) {
			t.Errorf("a process without the group is served")
		}
	})
}

// A FORK_PREPARE pauses evictions until its FORK_DONE, and no longer than
// maxForkPause when that never comes.
func TestForkPause(t *testing.T) {
	var f forkState
	log := zap.NewNop()
	t0 := time.Unix(1000, 0)
	if f.stalled(t0, log) {
		t.Fatal("paused without a fork")
	}
	f.prepare(3, t0)
	if !f.stalled(t0.Add(maxForkPause), log) {
		t.Fatal("not paused during a fork")
	}
	if f.stalled(t0.Add(maxForkPause+time.Nanosecond), log) || f.forking != 0 {
		t.Fatalf("still paused %v after FORK_PREPARE without FORK_DONE", maxForkPause)
	}
}

// A fork's copy waits forkCopyTTL for its child's HELLO, and a previous
// agent's clients wait ResumeWait to come back: both decided at the time
// given, not when a timer happens to fire.
func TestExpiries(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	a := &Agent{log: zap.NewNop(), copies: map[forkKey]*forkCopy{}, orphans: map[int]*orphan{}}
	a.opts.ResumeWait = time.Minute
	a.copies[forkKey{1, 1}] = &forkCopy{made: t0}
	a.dropStaleCopies(t0.Add(forkCopyTTL - time.Nanosecond))
	if len(a.copies) != 1 {
		t.Fatalf("a fork's copy dropped before %v", forkCopyTTL)
	}
	a.dropStaleCopies(t0.Add(forkCopyTTL))
	if len(a.copies) != 0 {
		t.Fatalf("a fork's copy kept %v after it was made", forkCopyTTL)
	}
	a.orphans[42] = &orphan{}
	a.resumeBy = t0.Add(a.opts.ResumeWait)
	a.dropOrphans(t0.Add(a.opts.ResumeWait - time.Nanosecond))
	if len(a.orphans) != 1 {
		t.Fatalf("a previous agent's client dropped before %v", a.opts.ResumeWait)
	}
	a.dropOrphans(t0.Add(a.opts.ResumeWait))
	if len(a.orphans) != 0 {
		t.Fatalf("a previous agent's client kept %v after the agent started", a.opts.ResumeWait)
	}
}
