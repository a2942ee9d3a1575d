package pager_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"rmem/pager"
	"rmem/pager/pagertest"
	"rmem/preload/shimtest"
	"rmem/userfaultfd"
)

// Private-memory semantics across fork (DESIGN.md pitfall 2), end to end:
// a C program under the shim fills 16 MiB (4 MiB budget: most of it is
// evicted), forks, and parent and child each write their own value over
// the same addresses, get evicted again and read back their own. As root
// the fork raises a FORK event; as an ordinary user the kernel grants no
// FORK events (they need CAP_SYS_PTRACE), nor a userfaultfd at all with
// vm.unprivileged_userfaultfd 0: the shim borrows /dev/userfaultfd from the
// agent, and forks through FORK_PREPARE and a uffd of the child's own.
func TestForkPrivate(t *testing.T) {
	skipUnlessUFFD(t)
	forkModes(t, "fork", forkPrivate)
	// The pool has room for the parent's pages once: the child shares
	// the parent's slots, so fork() needs no room (before slabs were
	// shared, it failed with ENOMEM). Both then rewrite their 16 MiB,
	// which the pool has no room for: their faults past the budget wait
	// (the budget holds, nothing is lost, the stats and the pool say so)
	// until the pool has room again, and then they finish, exact.
	t.Run("unprivileged, pool full", func(t *testing.T) {
		uid, gid := shimtest.Nobody(t)
		store, a := forkSetup(t, 24, []uint32{uid})
		store.SetLimit(16) // the parent's 16 MiB fit once
		p := shimtest.StartAs(t, uid, gid, a.Addr(), []string{"fork"})
		p.Expect("ready")
		waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 })
		p.Send("g")
		// The peak is sampled after each turn of either loop: when the
		// resident pages change.
		peak := uint64(0)
		var peakSt pager.ClientStats // the client at the peak, for a failure's message
		see := func(st pager.ClientStats) {
			if st.ResidentBytes > peak {
				peak, peakSt = st.ResidentBytes, st
			}
		}
		var sts []pager.ClientStats
		waits := map[uint64]uint64{}
		if !a.WaitForTest(agentWait, func() bool {
			sts = a.Stats()
			for _, st := range sts {
				see(st)
				if st.BudgetWaits > 0 && !st.NoRoomSince.IsZero() {
					waits[st.ID] = st.BudgetWaits
				}
			}
			return len(waits) == 2 && a.Pool().NoRoom != ""
		}) {
			t.Fatalf("parent and child never both waited for room: %+v, pool %+v", sts, a.Pool())
		}
		// Waiting, not progressing: each tries its faults again and
		// again, and waits each time.
		if !a.WaitForTest(agentWait, func() bool {
			sts = a.Stats()
			more := 0
			for _, st := range sts {
				see(st)
				if w, ok := waits[st.ID]; ok && st.BudgetWaits >= w+20 {
					more++
				}
			}
			return more == 2
		}) {
			t.Fatalf("parent and child do not try their faults again while the pool is full: %+v, waits then %v", sts, waits)
		}
		t.Logf("both wait for pool room: %+v", a.Pool())
		if budget := uint64(4 << 20); peak > budget+pager.BudgetMargin {
			t.Errorf("peak resident %d past the budget %d + margin %d while the pool was full (client at the peak: %+v)", peak, budget, pager.BudgetMargin, peakSt)
		}
		store.SetLimit(0) // room again
		p.Expect("")
		p.Expect("") // P and C: both wrote all of it
		p.Send("gg")
		oks := map[string]bool{p.Expect(""): true, p.Expect(""): true}
		if !oks["child ok"] || !oks["parent ok"] {
			t.Fatalf("got %v; stderr:\n%s", oks, p.Stderr.String())
		}
		p.Wait()
		waitNoClients(t, a)
		noSlabsHeld(t, store, a)
		if s := p.Stderr.String(); s != "" {
			t.Errorf("the shim said:\n%s", s)
		}
	})
}

// A fork shares the parent's pool slots with the child instead of copying
// them: the pool holds no more slabs while the child reads its whole
// inherited heap (beyond those for the pages resident at the fork, which
// have no pool copy yet), and the parent, writing everything anew while
// the child lives, writes back to slots of its own, never changing what
// the child reads (the program checks every word on both sides). With
// FORK events (root) and without (nobody).
func TestForkSharesSlabs(t *testing.T) {
	skipUnlessUFFD(t)
	prog := shimtest.Prog(t, "testdata/forkshare.c")
	run := func(t *testing.T, store *pagertest.Store, a *pager.Agent, p *shimtest.Proc) {
		p.Expect("ready")
		waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 && st.RemoteBytes > 8<<20 })
		_, before := store.Allocated()
		p.Send("g")
		p.Expect("C read")
		_, during := store.Allocated()
		var child pager.ClientStats
		for _, st := range a.Stats() {
			if st.PID != int(p.Pid()) {
				child = st
			}
		}
		t.Logf("slabs held before the fork %d, after the child read its heap %d; child %+v", before, during, child)
		// 1 MiB slabs; the 4 MiB budget bounds what was resident at
		// the fork. An eager copy would have taken another 12 or more.
		if during > before+6 {
			t.Errorf("the pool holds %d slabs after the fork, %d before: the child's pages were copied", during, before)
		}
		// The child reads its inherited pooled pages from the
		// parent's slots.
		if child.RemoteReads == 0 {
			t.Errorf("the child should read from the shared slots: %+v", child)
		}
		p.Send("g")
		if l := p.Expect("ok"); l != "ok" {
			t.Fatalf("program said %q", l)
		}
		p.Wait()
		waitNoClients(t, a)
		parent := exitedStats(a, int(p.Pid()))
		t.Logf("parent %+v", parent)
		if parent.WriteBacks == 0 {
			t.Errorf("the parent rewrote its heap under its budget without write-backs: %+v", parent)
		}
		noSlabsHeld(t, store, a)
	}
	forkModes(t, prog, run)
}

// Forks while other threads of the parent fault, evict and prefetch: 4
// forks of a 16 MiB heap under a 4 MiB budget, each child checking every
// word and writing its own; with FORK events (root) and without (nobody:
// FORK_PREPARE pauses the parent's evictions and copies its pooled pages
// while its threads go on faulting).
func TestForkBusy(t *testing.T) {
	skipUnlessUFFD(t)
	prog := shimtest.Prog(t, "testdata/forkbusy.c")
	run := func(t *testing.T, store *pagertest.Store, a *pager.Agent, p *shimtest.Proc) {
		if l := p.Expect("ok"); l != "ok" {
			t.Fatalf("program said %q", l)
		}
		p.Wait()
		waitNoClients(t, a)
		parent := exitedStats(a, int(p.Pid()))
		t.Logf("parent %+v; %d processes paged", parent, len(a.Exited()))
		if parent.Evictions == 0 || parent.RemoteReads == 0 || len(a.Exited()) != 5 {
			t.Fatalf("want the parent and 4 children paged, the parent with evictions and remote reads: %+v", a.Exited())
		}
		noSlabsHeld(t, store, a)
	}
	forkModes(t, prog, run)
}

// A child made by _Fork() (past fork(3), no atfork handler runs): it does
// not inherit the pooled allocations (MADV_DONTFORK), so touching one
// raises SIGSEGV rather than reading zeros (no FORK event: before, as an
// ordinary user its evicted pages read as zeros until its first call into
// the shim); and the parent's next fork(3) child is paired with its own
// FORK event (before, as root, with the _Fork() child's).
func TestForkLostPagesLoud(t *testing.T) {
	skipUnlessUFFD(t)
	prog := shimtest.Prog(t, "testdata/forklost.c")
	run := func(t *testing.T, store *pagertest.Store, a *pager.Agent, p *shimtest.Proc) {
		p.Expect("ready")
		waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 && st.RemoteBytes > 2<<20 })
		p.Send("g")
		if l := p.Expect("child "); l != "child SIGSEGV" {
			t.Fatalf("_Fork() child: %q, want SIGSEGV; stderr:\n%s", l, p.Stderr.String())
		}
		p.Expect("parent ok")
		if l := p.Expect("fork "); l != "fork exited 0" {
			t.Fatalf("fork(3) child: %q; stderr:\n%s", l, p.Stderr.String())
		}
		p.Wait()
		if !strings.Contains(p.Stderr.String(), "forked without fork(3)") {
			t.Errorf("the shim did not say why; stderr:\n%s", p.Stderr.String())
		}
		t.Logf("stderr: %s", strings.TrimSpace(p.Stderr.String()))
		waitNoClients(t, a)
		if n := len(a.Exited()); n != 2 {
			t.Errorf("%d processes paged, want the parent and its fork(3) child: %+v", n, a.Exited())
		}
		noSlabsHeld(t, store, a)
	}
	forkModes(t, prog, run)
}

// A process made by glibc's daemon(), which forks inside the C library
// (the shim's fork() wrapper never runs; its atfork handlers do): the
// daemon reads its parent's pooled pages, is paged as a client of its own,
// and its own fork(3) pairs right. With FORK events (root) and without
// (nobody: before the handlers, its evicted pages read as zeros).
func TestForkDaemon(t *testing.T) {
	skipUnlessUFFD(t)
	prog := shimtest.Prog(t, "testdata/daemonfork.c")
	run := func(t *testing.T, store *pagertest.Store, a *pager.Agent, p *shimtest.Proc) {
		p.Expect("ready")
		waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 && st.RemoteBytes > 4<<20 })
		p.Send("g")
		var daemon int
		if _, err := fmt.Sscanf(p.Expect("daemon ok"), "daemon ok %d", &daemon); err != nil {
			t.Fatal(err)
		}
		p.Wait()
		waitNoClients(t, a)
		st := exitedStats(a, daemon)
		t.Logf("daemon %+v; %d processes paged; stderr: %s", st, len(a.Exited()), strings.TrimSpace(p.Stderr.String()))
		if st.PID == 0 || st.RemoteReads == 0 || len(a.Exited()) != 3 {
			t.Fatalf("want the program, the daemon and its child paged, the daemon with remote reads: %+v", a.Exited())
		}
		noSlabsHeld(t, store, a)
	}
	forkModes(t, prog, run)
}

// A Go program of an ordinary user, through the client package: it has no
// userfaultfd of its own and borrows /dev/userfaultfd from the agent (when
// the tests run as such a user already, it takes a user-mode-only one:
// userMode).
func TestGoClientUnprivileged(t *testing.T) {
	skipUnlessUFFD(t)
	uid, gid := shimtest.Nobody(t)
	// The test binary, where that user may run it.
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "pager.test")
	data, err := os.ReadFile(os.Args[0])
	if err == nil {
		err = os.WriteFile(bin, data, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	store, a := forkSetup(t, 16, []uint32{uid})
	const budget = 4 << 20
	c := startChildAs(t, &syscall.Credential{Uid: uid, Gid: gid}, bin, a, childSpec{Bytes: 4 * budget, Passes: 2, Order: "random", Hold: true})
	res := c.result(t)
	if res.Bad != 0 || res.Pages != 4*budget/4096 {
		t.Fatalf("%d bad words of %d pages; first: %s", res.Bad, res.Pages, res.First)
	}
	if l := c.line(t); l != "DONE" {
		t.Fatalf("child said %q", l)
	}
	st := statsOf(t, a)
	if st.Evictions == 0 || st.RemoteReads == 0 || st.Lost != 0 {
		t.Fatalf("want evictions and remote reads, none lost: %+v", st)
	}
	if err := c.wait(t); err != nil {
		t.Fatal(err)
	}
	waitNoClients(t, a)
	noSlabsHeld(t, store, a)
}

// forkSetup starts an agent (4 MiB budget) that serves the users allow
// too, on a socket they can reach, with a pool of 2 servers of slabs 1 MiB
// slabs each.
// exitedStats returns the final stats of the exited process pid (zero if
// the agent has none).
func exitedStats(a *pager.Agent, pid int) pager.ClientStats {
	for _, st := range a.Exited() {
		if st.PID == pid {
			return st
		}
	}
	return pager.ClientStats{}
}

// forkModes runs prog with an agent of its own twice: as root, with FORK
// events (skipped if the kernel lacks them), and as user nobody, without.
func forkModes(t *testing.T, prog string, run func(*testing.T, *pagertest.Store, *pager.Agent, *shimtest.Proc)) {
	t.Run("root", func(t *testing.T) { forkWithEvents(t, prog, run) })
	t.Run("unprivileged", func(t *testing.T) {
		uid, gid := shimtest.Nobody(t)
		store, a := forkSetup(t, 48, []uint32{uid})
		run(t, store, a, shimtest.StartAs(t, uid, gid, a.Addr(), []string{prog}))
	})
}

// forkWithEvents runs prog as root, whose forks raise FORK events.
func forkWithEvents(t *testing.T, prog string, run func(*testing.T, *pagertest.Store, *pager.Agent, *shimtest.Proc)) {
	if os.Geteuid() != 0 {
		t.Skip("FORK events need CAP_SYS_PTRACE")
	}
	avail, _, _ := userfaultfd.Probe()
	if !avail.Has(userfaultfd.FeatureEventFork | userfaultfd.FeatureThreadID) {
		t.Skip("kernel lacks EVENT_FORK or THREAD_ID")
	}
	store, a := forkSetup(t, 48, nil)
	run(t, store, a, shimtest.Start(t, a.Addr(), []string{prog}))
}

func forkSetup(t *testing.T, slabs int, allow []uint32) (*pagertest.Store, *pager.Agent) {
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 1 << 20, SlabsPerServer: slabs})
	opts := pager.Options{Store: store, LocalMem: 4 << 20, AllowUIDs: allow}
	if allow != nil {
		dir := t.TempDir()
		for d := dir; d != filepath.Dir(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
			if strings.HasPrefix(d, os.TempDir()) && d != os.TempDir() {
				os.Chmod(d, 0o755)
			}
		}
		opts.Socket, opts.SocketMode = filepath.Join(dir, "agent.sock"), 0o666
	}
	return store, startAgentOpts(t, opts)
}

func forkPrivate(t *testing.T, store *pagertest.Store, a *pager.Agent, p *shimtest.Proc) {
	stderr, expect := &p.Stderr, p.Expect
	expect("ready")
	waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 })
	p.Send("g")
	got := map[byte]bool{}
	for range 2 {
		got[expect("")[0]] = true
	}
	if !got['P'] || !got['C'] {
		t.Fatalf("want P and C lines, got %v", got)
	}
	// Both processes are paged: each has evicted pages of its own.
	var st []pager.ClientStats
	if !a.WaitForTest(agentWait, func() bool {
		st = a.Stats()
		return len(st) == 2 && st[0].Evictions > 0 && st[1].Evictions > 0 && st[1].PID != 0
	}) {
		t.Fatalf("want two paged clients, got %+v", st)
	}
	t.Logf("parent %+v", st[0])
	t.Logf("child %+v", st[1])
	p.Send("gg")
	oks := map[string]bool{}
	for range 2 {
		oks[expect("")] = true
	}
	if !oks["child ok"] || !oks["parent ok"] {
		t.Fatalf("got %v; stderr:\n%s", oks, stderr.String())
	}
	p.Wait()
	waitNoClients(t, a)
	noSlabsHeld(t, store, a)
	if s := stderr.String(); s != "" {
		t.Errorf("the shim said:\n%s", s)
	}
}

// A child forked past fork(3) never says HELLO: the agent serves it through
// its FORK uffd alone (its evicted pages, copied to slabs of its own), and
// drops it when it exits although it has no pidfd for it. (The shim keeps
// regions out of such children; the program undoes that behind its back.)
func TestForkWithoutHello(t *testing.T) {
	skipUnlessUFFD(t)
	avail, _, _ := userfaultfd.Probe()
	if !avail.Has(userfaultfd.FeatureEventFork | userfaultfd.FeatureThreadID) {
		t.Skip("kernel lacks EVENT_FORK or THREAD_ID")
	}
	prog := shimtest.Prog(t, "testdata/nohello.c")
	const budget = 2 << 20
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 1 << 20, SlabsPerServer: 32})
	a := startAgent(t, store, budget)
	p := shimtest.Start(t, a.Addr(), []string{prog})
	stderr := &p.Stderr
	expect := func(want string) {
		t.Helper()
		if l := p.Expect(want); l != want {
			t.Fatalf("want %q, got %q; stderr:\n%s", want, l, stderr.String())
		}
	}
	expect("ready")
	waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 && st.RemoteBytes > 4<<20 })
	p.Send("g")
	expect("child ok")
	// The child's loop sees it gone (no HELLO, no pidfd: the probe).
	if !a.WaitForTest(agentWait, func() bool { return len(a.Stats()) == 1 }) {
		t.Fatalf("the child without HELLO is still served after it exited: %+v", a.Stats())
	}
	p.Send("g")
	expect("parent ok")
	p.Wait()
	waitNoClients(t, a)
	noSlabsHeld(t, store, a)
}

// Forks while three threads allocate and free through tcmalloc, whose
// spans and their metadata are paged (sbrk'd and mmap'd regions), under a
// 4 MiB budget: 40 forks, each child checking an 8 MiB block its parent
// filled and allocating from the allocator's state it inherited (a page
// of it read as zeros makes tcmalloc crash on a zeroed span). preload's
// test of the same program runs against its test agent; this one runs
// the pager. TestCoreForkEventBatch is the exact test of the ordering
// that such a crash found (this one passed 6 runs without it: the window
// is a few pages held back from prefetching).
func TestForkWhileAllocating(t *testing.T) {
	skipUnlessUFFD(t)
	lib := "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("%s is not installed (Debian: libtcmalloc-minimal4)", lib)
	}
	prog := shimtest.ProgAs(t, "forkstress.c", "forkstress-tcmalloc", lib)
	// With FORK events only (root): without, FORK_PREPARE copies the page
	// table before fork(2) with no event to order (TestForkBusy forks
	// both ways), and the two runs would double this test's time.
	forkWithEvents(t, prog, func(t *testing.T, store *pagertest.Store, a *pager.Agent, p *shimtest.Proc) {
		if l := p.Expect("ok"); l != "ok" {
			t.Fatalf("program said %q; stderr:\n%s", l, p.Stderr.String())
		}
		p.Wait()
		waitNoClients(t, a)
		parent := exitedStats(a, int(p.Pid()))
		t.Logf("parent %+v; %d processes paged", parent, len(a.Exited()))
		if parent.Evictions == 0 || parent.RemoteReads == 0 {
			t.Errorf("want the parent evicting and reading back while it forks: %+v", parent)
		}
		noSlabsHeld(t, store, a)
	})
}
