package preload

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// TestLostAgentFork: fork() in a process that lost its agent while a
// region of it has pages in the pool (testdata/lostfork.c), the agent
// gone for good (orphaned: none came back within RMEM_AGENT_WAIT) or
// dropped by the shim (off: a malformed packet; the agent, never told,
// still serves the uffd), with FORK events (root) and without (no
// CAP_SYS_PTRACE, as an ordinary user's uffd).
//
// A uffd acts on the address space of the process that made it, whoever
// calls it: a child that kept its parent's and unmapped the region
// unregistered it in the parent, whose pooled pages then read as zeros
// (DESIGN.md pitfall 5). The parent's pooled pages must fail loudly
// (orphaned: SIGBUS) or come back exact (off), whatever the child does,
// and fork() must return. The child inherits the regions where it can
// guard them (conn.c's lost_kind): its resident pages exact, its pooled
// ones SIGBUS, its new memory ordinary; where it cannot (off, with FORK
// events: the agent may read the uffd) it does not inherit them, and
// touching them raises SIGSEGV.
func TestLostAgentFork(t *testing.T) {
	needUFFD(t)
	for _, lose := range []string{"orphaned", "off"} {
		for _, forkEvents := range []bool{true, false} {
			for _, child := range []string{"unmap", "memory"} {
				name := fmt.Sprintf("%s/fork events %v/child %s", lose, forkEvents, child)
				t.Run(name, func(t *testing.T) { testLostAgentFork(t, lose, forkEvents, child) })
				if lose == "orphaned" {
					t.Run(name+"/ring", func(t *testing.T) { testLostAgentFork(t, lose, forkEvents, child, ringEnv) })
				}
			}
		}
	}
}

func testLostAgentFork(t *testing.T, lose string, forkEvents bool, child string, extra ...string) {
	a := newTestAgent(t)
	env := append([]string{proto.EnvAgentWait + "=300ms"}, extra...)
	if !forkEvents {
		env = append(env, "LOSTFORK_NO_PTRACE=1")
	}
	p := start(t, a.path, []string{"lostfork", child}, env...)
	r, err := strconv.ParseUint(strings.TrimPrefix(p.Expect("ready "), "ready 0x"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	const half = 2 << 20
	pooled := userfaultfd.Range{Start: userfaultfd.Addr(r + half), Len: half}
	if n, err := a.EvictRange(p.Pid(), pooled); err != nil || n != half/4096 {
		t.Fatalf("evicted %d pages of R's second half: %v", n, err)
	}
	if got := a.Stats(p.Pid()).Features.Has(userfaultfd.FeatureEventFork); got != forkEvents {
		t.Fatalf("the shim's uffd has FORK events: %v, want %v", got, forkEvents)
	}
	switch lose {
	case "orphaned":
		a.Close()
		waitStderr(t, p.Stderr.String, "rmem: no agent resumed this process")
	case "off":
		bad := (&proto.Ack{Seq: 1}).Encode(nil, 1)
		bad[0] = 'X'
		if _, err := a.Inject(p.Pid(), bad, false); err != nil {
			t.Fatal(err)
		}
		waitStderr(t, p.Stderr.String, "rmem: lost the agent (Protocol error)")
	}
	p.Send("g")
	fenced := lose == "off" && forkEvents
	switch {
	case child == "unmap":
		p.Expect("child exited 0")
	case fenced:
		p.Expect("child SIGSEGV")
	default:
		p.Expect("child resident ok")
		p.Expect("child new memory ok")
		p.Expect("child SIGBUS")
	}
	p.Expect("parent resident ok")
	p.Expect("parent reads pooled")
	if lose == "off" {
		p.Expect("parent pooled exact")
		p.Wait()
	} else {
		err := p.WaitErr()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGBUS {
			t.Fatalf("the orphaned parent reading its pooled pages ended with %v, want SIGBUS; stderr:\n%s", err, p.Stderr.String())
		}
	}
	want := "the pages of its memory that were in the pool are lost to it"
	if fenced {
		want = "it did not inherit that memory"
	}
	if e := p.Stderr.String(); !strings.Contains(e, "rmem: forked child") || !strings.Contains(e, want) {
		t.Errorf("stderr %q: want the child to say %q", e, want)
	}
}

// waitStderr waits (up to 20 s) until stderr() says want.
func waitStderr(t *testing.T, stderr func() string, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr %q, want %q", stderr(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLostAgentForkFenced: a process none of whose uffds holds its
// regions (a child whose HELLO the agent refused: they are registered with
// the FORK uffd the agent keeps) forks (testdata/fencefork.c). The
// grandchild cannot inherit them (copying them would raise a FORK event
// nobody may read): it returns from fork() without them, their addresses
// fenced, allocates from glibc in glibc mode, and unmapping the fenced
// region leaves its parent's memory alone.
func TestLostAgentForkFenced(t *testing.T) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"fencefork"})
	p.Expect("ready")
	a.mu.Lock()
	a.refuse = true
	a.mu.Unlock()
	p.Send("g")
	p.Expect("grandchild allocates ok")
	p.Expect("grandchild SIGSEGV")
	p.Expect("child ok")
	p.Expect("child exited 0")
	p.Expect("parent ok")
	p.Wait()
	if e := p.Stderr.String(); !strings.Contains(e, "agent refused: test agent refuses") || !strings.Contains(e, "did not inherit") {
		t.Errorf("stderr %q: want the refusal and the grandchild's fenced memory said", e)
	}
}

// TestOrphanedWritesRestoredPages: an orphaned process writes pages the
// agent had restored write-protected (the pager does, to see them
// dirtied; testdata/orphanwrite.c). Their data is resident and right:
// the helper, which answers the faults of an orphaned process, lets the
// write through (UFFDIO_POISON of a present page fails with EEXIST, and
// the writer used to wait for good).
func TestOrphanedWritesRestoredPages(t *testing.T) { bothModes(t, testOrphanedWritesRestoredPages) }

func testOrphanedWritesRestoredPages(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	a.restoreWP.Store(true)
	p := start(t, a.path, []string{"orphanwrite"}, append([]string{proto.EnvAgentWait + "=300ms"}, env...)...)
	p.Expect("ready ")
	evict(t, a, p.Pid(), 512)
	p.Send("g")
	p.Expect("read back")
	a.Close()
	waitStderr(t, p.Stderr.String, "rmem: no agent resumed this process")
	p.Send("g")
	l, ok := <-p.Lines
	if !ok || l != "written ok" {
		t.Fatalf("the orphaned process writing its restored pages said %q (%v); ended %v; stderr:\n%s", l, ok, p.WaitErr(), p.Stderr.String())
	}
	p.Wait()
}

// TestVforkChildMaps: a vfork() child maps memory before it execs or
// exits (testdata/vforkmap.c). It shares its parent's memory, the shim's
// state with it, and is not a child forked past fork(3): it must not drop
// the connection (in the parent's memory) as such a child drops the one it
// inherited. The parent's pages are still evicted and restored, and its
// new mapping is still a region.
func TestVforkChildMaps(t *testing.T) { bothModes(t, testVforkChildMaps) }

func testVforkChildMaps(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"vforkmap"}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 512)
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	if s := a.Stats(p.Pid()); s.Regions[proto.KindMmap] < 2 || s.Restores < 512 {
		t.Errorf("stats %+v: want the region restored, and the mmap after vfork a region too", s)
	}
	if strings.Contains(p.Stderr.String(), "rmem:") {
		t.Errorf("the shim complained: %s", p.Stderr.String())
	}
}
