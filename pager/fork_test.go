package pager_test

import (
	"testing"
	"time"

	"rmem/pager"
	"rmem/pager/pagertest"
	"rmem/preload/shimtest"
	"rmem/userfaultfd"
)

// Private-memory semantics across fork (DESIGN.md pitfall 2), end to end:
// a C program under the shim fills 16 MiB (4 MiB budget: most of it is
// evicted), forks, and parent and child each write their own value over
// the same addresses, get evicted again and read back their own.
func TestForkPrivate(t *testing.T) {
	skipUnlessUFFD(t)
	avail, _, _ := userfaultfd.Probe()
	if !avail.Has(userfaultfd.FeatureEventFork | userfaultfd.FeatureThreadID) {
		t.Skip("kernel lacks EVENT_FORK or THREAD_ID")
	}
	const budget = 4 << 20
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 1 << 20, SlabsPerServer: 48})
	a := startAgent(t, store, budget)
	p := shimtest.Start(t, a.Addr(), []string{"fork"})
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
	for i := 0; ; i++ {
		st := a.Stats()
		if len(st) == 2 && st[0].Evictions > 0 && st[1].Evictions > 0 && st[1].PID != 0 {
			t.Logf("parent %+v", st[0])
			t.Logf("child %+v", st[1])
			break
		}
		if i > 500 {
			t.Fatalf("want two paged clients, got %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	if _, held := store.Allocated(); held != 0 {
		t.Fatalf("%d slabs held after both processes exited", held)
	}
}

// A child forked past fork(3) never says HELLO: the agent serves it through
// its FORK uffd alone (its evicted pages, copied to slabs of its own), and
// drops it when it exits although it has no pidfd for it.
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
	for i := 0; len(a.Stats()) != 1; i++ {
		if i > 500 {
			t.Fatalf("the child without HELLO is still served after it exited: %+v", a.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Send("g")
	expect("parent ok")
	p.Wait()
	waitNoClients(t, a)
	if _, held := store.Allocated(); held != 0 {
		t.Fatalf("%d slabs held after both processes exited", held)
	}
}
