package pager

import (
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/procinfo"
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
// by (parent pid, serial), once; an unknown pairing times out; a process
// of another user, or whose parent is alive and not the forking one, is
// refused and the child stays for its own HELLO.
func TestForkPairing(t *testing.T) {
	a := &Agent{clients: map[uint64]*client{}, forked: map[forkKey]*client{}}
	waiting := make(chan struct{}, 1)
	a.cond = sync.NewCond(waitSignal{&a.mu, waiting})
	c := &client{id: 9}
	c.uid.Store(uint32(os.Getuid()))
	ppid := os.Getpid()
	// The child: a process of ours (its parent is ppid).
	kid := exec.Command("sleep", "30")
	if err := kid.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { kid.Process.Kill(); kid.Wait() }()
	child := &unix.Ucred{Pid: int32(kid.Process.Pid), Uid: uint32(os.Getuid())}
	go func() {
		<-waiting // the HELLO came first: its pairing waits for the FORK
		a.mu.Lock()
		a.forked[forkKey{ppid, 2}] = c
		a.cond.Broadcast()
		a.mu.Unlock()
	}()
	soon := func() time.Time { return time.Now().Add(30 * time.Millisecond) }
	impostor := &unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid())} // its parent is alive, not ppid
	if got := a.takeForkChild(ppid, 2, impostor, time.Now().Add(5*time.Second)); got != nil {
		t.Fatal("paired with a process that is not the parent's child")
	}
	if got := a.takeForkChild(ppid, 2, &unix.Ucred{Pid: child.Pid, Uid: child.Uid + 1}, soon()); got != nil {
		t.Fatal("paired with a process of another user")
	}
	if got := a.takeForkChild(ppid, 2, child, soon()); got != c {
		t.Fatalf("got %v", got)
	}
	if got := a.takeForkChild(ppid, 2, child, soon()); got != nil {
		t.Fatal("paired twice")
	}
	if got := a.takeForkChild(ppid, 1, child, soon()); got != nil {
		t.Fatal("paired with the wrong serial")
	}
}

// waitSignal is the Locker of a sync.Cond that says when a waiter has
// started to wait: only Wait calls the Cond's Unlock (the code under test
// takes and leaves the mutex itself).
type waitSignal struct {
	*sync.Mutex
	waiting chan struct{}
}

func (w waitSignal) Unlock() {
	w.Mutex.Unlock()
	select {
	case w.waiting <- struct{}{}:
	default:
	}
}

// childOf: a child of a live parent, or of one that exited (daemon():
// reparented); not a process whose live parent is another.
func TestChildOf(t *testing.T) {
	kid := exec.Command("sleep", "30")
	if err := kid.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { kid.Process.Kill(); kid.Wait() }()
	if !childOf(kid.Process.Pid, os.Getpid()) {
		t.Error("a child of ours is not")
	}
	if childOf(os.Getpid(), os.Getpid()) {
		t.Error("we are our own child")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if !procinfo.Exited(gone.Process.Pid) || !childOf(os.Getpid(), gone.Process.Pid) {
		t.Error("a process whose parent exited is not taken as its child")
	}
	if procinfo.Exited(os.Getpid()) {
		t.Error("we have exited")
	}
}
