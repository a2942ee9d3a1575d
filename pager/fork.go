package pager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
	"rmem/procinfo"
	"rmem/userfaultfd"
)

// fork handles a FORK event: fd is the child's uffd. The child becomes a
// client of its own, served at once (its first faults may come before its
// HELLO). Its page tables start as copies of the parent's (copyRegions).
// The child is paired with its HELLO by (parent pid, fork serial).
func (c *client) fork(fd int) {
	c.fk.forks++
	c.forked()
	serial := c.fk.forks
	u, err := c.a.childUFFD(fd, c.features)
	if err != nil {
		unix.Close(fd)
		c.log.Error("child uffd unusable; the child is not paged", zap.Error(err))
		return
	}
	child, err := c.a.newClient(u, c.features)
	if err != nil {
		u.Close()
		c.log.Error("cannot serve forked child", zap.Error(err))
		return
	}
	child.bud.localMem.Store(c.bud.localMem.Load()) // its HELLO may say otherwise
	child.bud.maxSlowdown.Store(c.bud.maxSlowdown.Load())
	child.uid.Store(c.uid.Load())
	// The helper may have dropped victims of the batch in flight before
	// fork(2) copied the page tables (the child lacks them) or after (the
	// child has them): wait for its EVICTED so that the copy below sees
	// them in the pool, which is right either way (a page the child has
	// mapped never faults). Copying them as resident instead made the
	// child read zeros, or deadlock when its own helper, evicting such a
	// page, faulted on it.
	if c.ev.evictBusy {
		// The FORK waited for its EVICTED (park) and gave up.
		c.log.Error("the eviction in flight at fork did not finish; its pages are lost to the child")
	}
	c.fk.parkedSince = time.Time{}
	regs, err := c.copyRegions()
	if err != nil {
		c.log.Error("copying regions for the forked child failed; the pages not copied are lost to the child", zap.Error(err))
	}
	child.adopt(regs)
	c.a.addForkChild(int(c.pidAtm.Load()), serial, child)
}

// copyRegions returns copies of c's regions for a child forked now. A
// child's page tables start as copies of the parent's: resident pages are
// the child's own copy-on-write pages; pages in the pool stay where they
// are, in slots the child names too (forkRegion), so that later
// write-backs of either process never show through to the other
// (private-memory semantics, DESIGN.md pitfall 2). Pages that could not be
// kept are Lost in the copy (SIGBUS, never zeros); the error says why.
// Preconditions: no eviction batch in flight.
func (c *client) copyRegions() ([]*region, error) {
	regs := make([]*region, 0, len(c.regs.list))
	var errs []error
	for _, r := range c.regs.list {
		cr, err := c.forkRegion(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("region %d: %w", r.id, err))
		}
		regs = append(regs, cr)
	}
	return regs, errors.Join(errs...)
}

// adopt makes regs, copied for a fork, c's own.
func (c *client) adopt(regs []*region) {
	for _, r := range regs {
		for idx, p := range r.pages {
			c.count(p.State(), +1)
			if r.slots[idx] != 0 {
				c.st.pooled.Add(1)
			}
		}
		c.regs.add(r)
		c.st.regions.Add(1)
		if r.px != nil {
			r.px.c = c
			c.a.shm.join(r)
		}
	}
}

// forkRegion returns the child's copy of r. A page in the pool stays in
// its slot, which the child names too (one more reference): no page moves
// at the fork, and the pool needs no room for the child. Neither side
// writes a slot that another names, because a write-back always takes a
// slot of its own (slots.go): copy-on-write at page granularity. A Staged
// page (its write-back failed: the data is in the parent's staging slot,
// not the pool) gets a slot of the child's own, written now.
func (c *client) forkRegion(r *region) (*region, error) {
	if r.px != nil {
		// The child maps the same segment: a proxy of its own.
		px := *r.px
		px.c, px.live = nil, slices.Clone(r.px.live)
		return &region{id: r.id, start: r.start, kind: r.kind, px: &px, plen: r.plen}, nil
	}
	n := len(r.pages)
	cr := &region{id: r.id, start: r.start, kind: r.kind, pages: make(PageTable, n), slots: make([]Slot, n)}
	if r.pf != nil {
		cr.pf = NewPrefetcher(32, c.a.opts.MaxPrefetch)
	}
	// With FORK events the child's page tables keep the uffd-wp bits
	// (its vmas stay registered): a page clean in the parent is clean in
	// the child, its pool copy shared, and a write by the child faults.
	// Without, the child registers its ranges anew and the bits are
	// gone: its resident pages are dirty.
	keepClean := c.features&userfaultfd.FeatureEventFork != 0
	var staged []int
	for idx, p := range r.pages {
		pooled := r.slots[idx] != 0 && !p.Has(FlagDirty)
		switch p.State() {
		case Resident:
			switch {
			case p.Has(FlagBusy) && pooled:
				// Only when the fork gave up waiting (park): being evicted clean,
				// maybe dropped before fork(2); the pool has it.
				cr.pages[idx], cr.slots[idx] = Page(0).With(Remote), r.slots[idx]
			case p.Has(FlagBusy):
				// Being evicted dirty: maybe dropped before fork(2),
				// its data in the parent's staging slot or nowhere yet.
				cr.pages[idx] = Page(0).With(Lost)
			case keepClean && pooled:
				cr.pages[idx], cr.slots[idx] = Page(0).With(Resident), r.slots[idx]
			default:
				cr.pages[idx] = Page(0).With(Resident) | FlagDirty
			}
		case Remote:
			cr.pages[idx], cr.slots[idx] = Page(0).With(Remote), r.slots[idx]
		case Staged:
			cr.pages[idx] = Page(0).With(Lost) // unless writeStaged saves it
			staged = append(staged, idx)
		case Lost:
			cr.pages[idx] = Page(0).With(Lost)
		}
	}
	c.a.slots.ref(cr.slots...)
	return cr, c.writeStaged(r, cr, staged)
}

// writeStaged gives the child's region cr slots of its own for the pages
// of r that are Staged (pages idxs), written from r's staging slots. A page
// that gets no slot or whose WRITE fails stays Lost in cr. Replicas that
// cannot be reached right now are tried 3 times.
func (c *client) writeStaged(r, cr *region, idxs []int) error {
	if len(idxs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	defer cancel()
	var errs []error
	slots := make([]Slot, len(idxs))
	got := c.a.slots.alloc(slots)
	if got < len(idxs) {
		c.a.slots.release(slots[:got]...)
		return fmt.Errorf("no pool slots for %d pages whose write-back failed: they are lost to the child", len(idxs))
	}
	ops := make([]remote.PageOp, 0, len(idxs))
	at := make([]int, 0, len(idxs))
	for k, idx := range idxs {
		stage := c.ev.stageOf(r, idx)
		if stage < 0 {
			c.a.slots.release(slots[k])
			continue
		}
		slab, off := c.a.slots.where(slots[k])
		ops = append(ops, remote.PageOp{Slab: slab, Off: off, Buf: c.ev.stageBuf(stage)})
		at = append(at, k)
	}
	for try := 0; ; try++ {
		c.io.Write(ctx, ops)
		again := ops[:0]
		var againAt []int
		for j, op := range ops {
			k := at[j]
			switch {
			case op.Err == nil:
				cr.pages[idxs[k]], cr.slots[idxs[k]] = Page(0).With(Remote), slots[k]
			case errors.Is(op.Err, remote.ErrUnavailable) && try < 2 && ctx.Err() == nil:
				again = append(again, op)
				againAt = append(againAt, k)
			default:
				c.a.slots.release(slots[k])
				errs = append(errs, op.Err)
			}
		}
		if len(again) == 0 {
			break
		}
		ops, at = again, againAt
		time.Sleep(200 * time.Millisecond)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d staged pages lost to the child: %w", len(errs), errs[0])
	}
	return nil
}

// A fork without FORK events (the client's uffd lacks EVENT_FORK, which
// the kernel grants only with CAP_SYS_PTRACE) goes:
//
//  1. the parent's shim sends FORK_PREPARE before fork(2); the loop stops
//     evicting it, lets an eviction batch in flight finish, copies its
//     pooled pages for the child (copyRegions) and keeps the copy here;
//  2. fork(2): the child's registered ranges are plain anonymous memory,
//     its resident pages inherited, the evicted ones missing;
//  3. the child, still inside the shim's fork wrapper, registers the
//     ranges with a uffd of its own and says HELLO with it; the agent
//     serves it with the copy (handshake);
//  4. the parent sends FORK_DONE: evictions resume, and a failed fork's
//     copy is freed.
//
// The copy is made before fork(2), so that the parent cannot write an
// evicted page back over what the child inherits. Pages the parent faults
// in between (1) and (2) are resident in the child though the copy names
// them Remote: they stay resident, outside its budget, which is harmless.

// forkCopy is the copy of a parent's regions that FORK_PREPARE made for
// the child it announced.
type forkCopy struct {
	regs        []*region
	uid         uint32 // the parent's: only a process of the same user takes the copy
	child       int    // the child's pid, once FORK_DONE said it
	localMem    uint64
	maxSlowdown uint32
	made        time.Time
}

// forkCopyTTL is how long a copy waits for its child's HELLO (the child
// says it before its fork() returns).
const forkCopyTTL = time.Minute

// A fork needs no eviction batch in flight: the helper may have dropped
// the batch's victims before fork(2) copied the page tables or after, and
// only its EVICTED says they are in the pool. So a fork that meets one
// waits for it, parked, while the loop goes on serving the socket (and,
// for a FORK_PREPARE, the uffd): a FORK event and the messages after it
// wait in c.fq.parked, unread ones in the kernel; a FORK_PREPARE waits
// unanswered. The loop resumes it when the EVICTED has come, the client
// is gone, or after maxSettle (forkSettled); nothing is handled from
// inside another handler.

// park sets aside msgs, from a FORK event on, and the messages read ahead
// after them, until the eviction in flight is done. Nothing is installed
// meanwhile (errForkAhead): the child's page tables are copied already.
func (c *client) park(msgs []userfaultfd.Msg, now time.Time) {
	c.fk.park(msgs, c.fq.early, now)
	c.fq.early = c.fq.early[:0]
}

// mustPark reports whether a fork must wait at now for the eviction in
// flight.
func (c *client) mustPark(now time.Time) bool {
	return c.fk.mustPark(c.ev.evictBusy && c.sock.conn != nil, now)
}

// parked reports whether uffd messages wait for the eviction in flight.
func (c *client) parked() bool { return len(c.fk.parked) > 0 }

// forkPrepare handles FORK_PREPARE (step 1 above); it reports whether the
// answer waits for the eviction in flight (forkSettled sends it), else
// the answer is err. now is the turn's time.
func (c *client) forkPrepare(seq uint32, m *proto.ForkPrepare, now time.Time) (wait bool, err error) {
	switch {
	case c.features&userfaultfd.FeatureEventFork != 0:
		return false, errWithErrno(unix.EINVAL, "FORK_PREPARE from a client whose uffd has FORK events")
	case c.fk.forking != 0:
		return false, errWithErrno(unix.EBUSY, fmt.Sprintf("FORK_PREPARE %d while fork %d is not done", m.Serial, c.fk.forking))
	}
	c.fk.prepare(m.Serial, now)
	if c.mustPark(now) {
		c.fk.waitPrepare(seq, now)
		return true, nil
	}
	return false, c.finishForkPrepare()
}

// finishForkPrepare copies the pooled pages for the child FORK_PREPARE
// announced, with no eviction in flight.
func (c *client) finishForkPrepare() error {
	c.fk.parkedSince = time.Time{}
	if c.ev.evictBusy {
		c.fk.forking = 0
		return errWithErrno(unix.EIO, "the eviction in flight did not finish")
	}
	serial := c.fk.forking
	regs, err := c.copyRegions()
	if err != nil {
		c.a.freeRegions(regs)
		c.fk.forking = 0
		return errWithErrno(unix.ENOMEM, "copying the pooled pages for the child: "+err.Error())
	}
	copied := c.a.opts.Now() // the copy may have taken a while (writeStaged)
	c.a.addForkCopy(forkKey{int(c.pidAtm.Load()), serial}, &forkCopy{
		regs: regs, uid: c.uid.Load(), localMem: c.bud.localMem.Load(), maxSlowdown: c.bud.maxSlowdown.Load(), made: copied,
	})
	c.fk.forkedAt = copied // the pause counts from the ACK
	c.log.Debug("pages copied for a fork", zap.Uint64("serial", serial), zap.Int("regions", len(regs)))
	return nil
}

// forkDone handles FORK_DONE (step 4 above).
func (c *client) forkDone(m *proto.ForkDone) {
	if m.Serial != c.fk.forking {
		c.log.Warn("FORK_DONE of a fork not prepared", zap.Uint64("serial", m.Serial), zap.Uint64("preparing", c.fk.forking))
	}
	c.fk.forking = 0
	c.a.forkReturned(forkKey{int(c.pidAtm.Load()), m.Serial}, int(m.PID))
}

// addForkCopy keeps fc for its child's HELLO; copies whose child never
// came are dropped after forkCopyTTL.
func (a *Agent) addForkCopy(k forkKey, fc *forkCopy) {
	a.mu.Lock()
	old := a.copies[k]
	a.copies[k] = fc
	a.mu.Unlock()
	if old != nil {
		a.freeRegions(old.regs)
	}
	time.AfterFunc(forkCopyTTL, func() { a.dropStaleCopies(a.opts.Now()) })
}

// dropStaleCopies frees the copies older than forkCopyTTL at now.
func (a *Agent) dropStaleCopies(now time.Time) {
	var stale []*region
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	for k, fc := range a.copies {
		if now.Sub(fc.made) >= forkCopyTTL {
			a.log.Warn("a forked child never said HELLO; its copy of the parent's pages is dropped",
				zap.Int("ppid", k.ppid), zap.Uint64("serial", k.serial), zap.Int("child", fc.child))
			stale = append(stale, fc.regs...)
			delete(a.copies, k)
		}
	}
	a.mu.Unlock()
	a.freeRegions(stale)
}

// forkReturned records what fork(2) returned in the parent: the child's
// pid, or a negative errno (the copy is freed).
func (a *Agent) forkReturned(k forkKey, pid int) {
	a.mu.Lock()
	fc := a.copies[k]
	if fc != nil && pid < 0 {
		delete(a.copies, k)
	} else if fc != nil {
		fc.child = pid
	}
	a.mu.Unlock()
	if fc != nil && pid < 0 {
		a.freeRegions(fc.regs)
	}
}

// takeForkCopy hands the copy k to the process cred if it is that fork's
// child: the parent's user, and the pid FORK_DONE named or a child of the
// parent (childOf).
func (a *Agent) takeForkCopy(k forkKey, cred *unix.Ucred) *forkCopy {
	a.mu.Lock()
	defer a.mu.Unlock()
	fc := a.copies[k]
	if fc == nil || fc.uid != cred.Uid {
		return nil
	}
	if fc.child != int(cred.Pid) && !childOf(int(cred.Pid), k.ppid) {
		return nil
	}
	delete(a.copies, k)
	return fc
}

// childOf reports whether process pid may be a child process ppid forked:
// its parent is ppid, or ppid has exited (its children were reparented to
// a reaper; daemon()'s parent exits at once, often before the child says
// HELLO). A process whose parent is alive and another is refused.
func childOf(pid, ppid int) bool {
	if s, err := procinfo.ReadStat(pid); err == nil && s.PPID == ppid {
		return true
	}
	return procinfo.Exited(ppid)
}
