package pager

import (
	"testing"
	"time"
)

func TestBudgetSplit(t *testing.T) {
	for _, tc := range []struct {
		local, node uint64
		clients     int64
		want        int
	}{
		{1 << 20, 0, 5, 256},
		{1 << 20, 4 << 20, 1, 256},
		{1 << 20, 4 << 20, 8, 128},
		{1 << 20, 4 << 20, 0, 256},
	} {
		a := &Agent{opts: Options{LocalMem: tc.local, NodeMem: tc.node}}
		a.nclients.Store(tc.clients)
		if got := a.budgetPages(0); got != tc.want {
			t.Errorf("local %d node %d clients %d: %d pages, want %d", tc.local, tc.node, tc.clients, got, tc.want)
		}
	}
	// A client's own budget (HELLO) replaces LocalMem, bigger or
	// smaller, and still takes no more than its share of NodeMem.
	a := &Agent{opts: Options{LocalMem: 1 << 20, NodeMem: 8 << 20}}
	a.nclients.Store(2)
	for _, tc := range []struct {
		local uint64
		want  int
	}{{0, 256}, {512 << 10, 128}, {2 << 20, 512}, {16 << 20, 1024}} {
		if got := a.budgetPages(tc.local); got != tc.want {
			t.Errorf("client budget %d: %d pages, want %d", tc.local, got, tc.want)
		}
	}
}

// FORK pairing: a child's HELLO finds the loop its parent's FORK made,
// by (parent pid, serial), once; an unknown pairing times out.
func TestForkPairing(t *testing.T) {
	a := &Agent{clients: map[uint64]*client{}, forked: map[forkKey]*client{}}
	a.cond = newCond(a)
	c := &client{id: 9}
	go func() {
		time.Sleep(20 * time.Millisecond) // the HELLO may come first
		a.mu.Lock()
		a.forked[forkKey{100, 2}] = c
		a.cond.Broadcast()
		a.mu.Unlock()
	}()
	if got := a.takeForkChild(100, 2, time.Now().Add(5*time.Second)); got != c {
		t.Fatalf("got %v", got)
	}
	if got := a.takeForkChild(100, 2, time.Now().Add(30*time.Millisecond)); got != nil {
		t.Fatal("paired twice")
	}
	if got := a.takeForkChild(100, 1, time.Now().Add(30*time.Millisecond)); got != nil {
		t.Fatal("paired with the wrong serial")
	}
}
