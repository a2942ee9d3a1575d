package pager

import (
	"context"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/remote"
	"rmem/userfaultfd"
)

// Every test's agent checks its slots after each batch (checkSlots).
func init() { checkInvariants = true }

// AllocSlotsForTest takes n pool slots for a test, waiting (2 s at most)
// for the reservoir to bring the slabs they need: an alloc that comes back
// short asks it for a slab, and its rounds wake the wait.
func (a *Agent) AllocSlotsForTest(n int) ([]Slot, error) {
	out := make([]Slot, n)
	got := 0
	if !a.WaitForTest(2*time.Second, func() bool {
		got += a.slots.alloc(out[got:])
		return got == n
	}) {
		a.slots.release(out[:got]...)
		return nil, fmt.Errorf("pager: only %d of %d slots", got, n)
	}
	return out, nil
}

// The agent's periods, for tests that move its clock (Options.Now).
const (
	ProbePeriod = probePeriod
	NoRoomPause = noRoomPause
	MaxThrottle = maxThrottle
)

// WaitForTest waits until cond holds, checking it after each turn of a
// loop, round of the reservoir and client started or dropped (what
// changes the stats, the pool and the clients), for at most d; it reports
// whether cond held.
func (a *Agent) WaitForTest(d time.Duration, cond func() bool) bool { return a.watch.wait(d, cond) }

// WakeForTest wakes every loop and the reservoir, as their timers would,
// and drops what has waited too long (fork copies, a previous agent's
// clients): after a test moved the agent's clock (Options.Now), the
// decisions see the new time.
func (a *Agent) WakeForTest() {
	a.wakeAll()
	a.slots.kickReservoir()
	now := a.opts.Now()
	a.dropStaleCopies(now)
	a.dropOrphans(now)
}

// SlotWhere returns the slab and offset of slot s.
func (a *Agent) SlotWhere(s Slot) (remote.SlabID, uint64) { return a.slots.where(s) }

// SlotRefs returns the references to slot s.
func (a *Agent) SlotRefs(s Slot) int {
	a.slots.mu.Lock()
	defer a.slots.mu.Unlock()
	sl, pg := a.slots.locLocked(s)
	if sl == nil {
		return 0
	}
	return int(sl.refs[pg]) + int(sl.over[pg])
}

// ReleaseSlotsForTest drops a reference to each of ss.
func (a *Agent) ReleaseSlotsForTest(ss ...Slot) { a.slots.release(ss...) }

// ReservoirStepForTest runs one round of the reservoir now.
func (a *Agent) ReservoirStepForTest() {
	a.slots.step(context.Background(), a.opts.Now(), reservoirTick)
}

// ForkRegionForTest runs the fork's copy of one region (forkRegion) on a
// client of a that has never served a process: the parent region holds
// pages in slots (0 for none) and the pages its Staged ones hold in staging
// slots (a failed write-back). It returns the child's page table and slots.
func (a *Agent) ForkRegionForTest(pages []Page, slots []Slot, staged map[int][]byte, forkEvents bool) ([]Page, []Slot, error) {
	io, err := a.opts.Store.OpenIO()
	if err != nil {
		return nil, nil, err
	}
	defer io.Close()
	c := &client{a: a, log: a.log, io: io, ev: evictState{staging: make([]byte, len(staged)*pageSize), stageOwner: make([]pageRef, len(staged))}}
	if forkEvents {
		c.features = userfaultfd.FeatureEventFork
	}
	r := &region{id: 1, start: 1 << 30, pages: PageTable(pages), slots: slots}
	stage := 0
	for idx, data := range staged {
		copy(c.ev.staging[stage*pageSize:], data)
		c.ev.stageOwner[stage] = pageRef{r, idx}
		stage++
	}
	cr, err := c.forkRegion(r)
	return cr.pages, cr.slots, err
}

// ServeForTest serves a process whose userfaultfd is u (a fake kernel:
// pagertest.Kernel) over conn, as if it had said HELLO with pid (0: not
// known, as for a child forked past fork(3)) and budget localMem (0: the
// agent's), with UFFDIO_POISON. It returns a descriptor of the client's
// staging memfd (the caller's) and its size in pages.
func (a *Agent) ServeForTest(u faultFD, conn *net.UnixConn, pid int, localMem uint64) (stagingFD, slots int, err error) {
	c, err := a.newClient(u, userfaultfd.FeaturePoison)
	if err != nil {
		return -1, 0, err
	}
	c.bud.localMem.Store(localMem)
	return a.serveForTest(c, conn, pid)
}

// ServeRingForTest is ServeForTest for a process whose faults come through
// the fault ring (its uffd raises SIGBUS): it returns a descriptor of the
// client's doorbell too (pagertest.NewRingProcess).
func (a *Agent) ServeRingForTest(u faultFD, conn *net.UnixConn, pid int, localMem uint64) (stagingFD, slots, doorbell int, err error) {
	c, err := a.newClient(u, userfaultfd.FeaturePoison|userfaultfd.FeatureSigbus)
	if err != nil {
		return -1, 0, -1, err
	}
	c.bud.localMem.Store(localMem)
	if doorbell, err = unix.Dup(c.wakefd); err != nil {
		c.teardownUnstarted()
		return -1, 0, -1, err
	}
	stagingFD, slots, err = a.serveForTest(c, conn, pid)
	if err != nil {
		unix.Close(doorbell)
	}
	return stagingFD, slots, doorbell, err
}

// serveForTest starts client c's loop on conn, the connection of process
// pid, and returns a descriptor of its staging memfd and its size in pages.
func (a *Agent) serveForTest(c *client, conn *net.UnixConn, pid int) (stagingFD, slots int, err error) {
	fd, err := unix.Dup(c.ev.stagingFD)
	if err != nil {
		c.teardownUnstarted()
		return -1, 0, err
	}
	if !a.start(c) {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("pager: agent closed")
	}
	c.attach(conn, pid)
	return fd, len(c.ev.stageOwner), nil
}

// ServeForkChildForTest serves the child of fork serial of the client
// whose pid is ppid, as ServeForTest does a process: it takes the copy of
// the parent's pages that FORK_PREPARE made, as the HELLO of a child with
// a uffd of its own does (without its credential checks).
func (a *Agent) ServeForkChildForTest(u faultFD, conn *net.UnixConn, ppid, pid int, serial uint64) (stagingFD, slots int, err error) {
	k := forkKey{ppid, serial}
	a.mu.Lock()
	fc := a.copies[k]
	delete(a.copies, k)
	a.mu.Unlock()
	if fc == nil {
		return -1, 0, fmt.Errorf("pager: no FORK_PREPARE of fork %d of pid %d", serial, ppid)
	}
	c, err := a.newClient(u, userfaultfd.FeaturePoison)
	if err != nil {
		a.freeRegions(fc.regs)
		return -1, 0, err
	}
	c.adopt(fc.regs)
	c.bud.localMem.Store(fc.localMem)
	return a.serveForTest(c, conn, pid)
}

// FaultFD is the uffd a client's loop uses (a fake kernel in the tests).
type FaultFD = faultFD

// ChildUFFDForTest makes the uffd of a FORK event's child with f: the
// fake kernel whose Fd the event names.
func (a *Agent) ChildUFFDForTest(f func(fd int) (FaultFD, error)) {
	a.childUFFD = func(fd int, _ userfaultfd.Feature) (faultFD, error) { return f(fd) }
}

// AttachForkChildForTest gives the child of fork serial of the client
// whose pid is ppid, made by its FORK event, the connection conn of
// process pid, as the child's HELLO does (without its credential checks),
// waiting (d at most) for the parent's loop to have handled the FORK. It
// returns a descriptor of the child's staging memfd and its size in pages.
func (a *Agent) AttachForkChildForTest(conn *net.UnixConn, ppid, pid int, serial uint64, d time.Duration) (stagingFD, slots int, err error) {
	k := forkKey{ppid, serial}
	late := false
	t := time.AfterFunc(d, func() {
		a.mu.Lock()
		late = true
		a.cond.Broadcast()
		a.mu.Unlock()
	})
	defer t.Stop()
	a.mu.Lock()
	c := a.forked[k]
	for c == nil && !late && !a.closed {
		a.cond.Wait()
		c = a.forked[k]
	}
	delete(a.forked, k)
	a.mu.Unlock()
	if c == nil {
		return -1, 0, fmt.Errorf("pager: no FORK event %d of pid %d handled", serial, ppid)
	}
	fd, err := unix.Dup(c.ev.stagingFD)
	if err != nil {
		return -1, 0, err
	}
	c.attach(conn, pid)
	return fd, len(c.ev.stageOwner), nil
}
