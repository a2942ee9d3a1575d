package pager

import (
	"slices"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
	"rmem/userfaultfd"
)

// maybeEvict starts an eviction batch when resident pages are past the
// high watermark: CLOCK picks victims, they are write-protected (a write
// from now on faults to us and waits) and named in an EVICT to the
// client's helper thread, dirty ones with a staging slot to copy them to
// and a pool slot to write them to, clean ones (the pool has them)
// without. One batch is in flight at a time. Victims are sorted so that
// adjacent ones share a WRITEPROTECT here and a MADV_DONTNEED in the
// helper, and take consecutive pool slots (one READ when they come back
// together). A dirty victim for which the pool has no slot stays resident:
// clean ones are still evicted, and faults past the budget wait (throttle).
// now is the turn's time.
func (c *client) maybeEvict(now time.Time) {
	if c.sock.conn == nil || c.ev.evictBusy || c.fk.stalled(now, c.log) || len(c.ev.stageFree) == 0 || c.room.paused(now) {
		return
	}
	w := WatermarksFor(c.budgetPages())
	need := w.ToEvict(int(c.st.resident.Load()), 0)
	if need <= 0 {
		return
	}
	need = min(need, proto.MaxEvictBatch, len(c.ev.stageFree))
	n := c.ev.clock.Victims(c.regs.tables, c.ev.victims[:need])
	c.st.hot.Store(int64(c.ev.clock.Hot()))
	if n == 0 {
		return
	}
	victims := c.ev.victims[:n]
	slices.SortFunc(victims, func(a, b Victim) int {
		if a.Table != b.Table {
			return a.Table - b.Table
		}
		return a.Page - b.Page
	})
	victims = c.slotsFor(victims, now)
	if len(victims) == 0 {
		return
	}

	k, ns := 0, 0
	for i := 0; i < len(victims); {
		r := c.regs.list[victims[i].Table]
		j := i + 1
		for j < len(victims) && victims[j].Table == victims[i].Table && victims[j].Page == victims[j-1].Page+1 {
			j++
		}
		var err error
		if c.ring == nil { // (a ring client's helper protects them itself, after its pins: protectDirty)
			err = c.protectDirty(r, victims[i:j])
		}
		for _, v := range victims[i:j] {
			dirty := needsWrite(r, v.Page)
			if err != nil {
				r.pages[v.Page] &^= FlagBusy
				if dirty {
					c.a.slots.release(c.ev.newSlots[ns])
					ns++
				}
				continue
			}
			stage := proto.NoSlot
			if dirty {
				stage = c.ev.takeStage(pageRef{r, v.Page})
				// Journal order (journal.go): the staging slot, then the
				// pool slot, both before the EVICT that drops the page.
				c.cj.stage(int(stage), r.id, v.Page, true)
				c.setSlot(r, v.Page, c.ev.newSlots[ns]) // written when the helper has copied it
				ns++
			}
			c.ev.evict.Pages[k] = proto.EvictPage{Addr: r.addr(v.Page), Slot: stage}
			c.ev.evictRefs[k] = pageRef{r, v.Page}
			k++
		}
		i = j
	}
	if k == 0 {
		return
	}
	c.ev.evictSeq++
	c.ev.evict.Batch, c.ev.evict.N = c.ev.evictSeq, k
	if err := c.sock.send(&c.ev.evict); err != nil {
		c.log.Warn("sending EVICT failed; eviction stops until the client reconnects", zap.Error(err))
		for i := 0; i < k; i++ {
			ref := c.ev.evictRefs[i]
			ref.r.pages[ref.idx] &^= FlagBusy
			if s := c.ev.evict.Pages[i].Slot; s != proto.NoSlot {
				c.freeStage(int(s))
				c.setSlot(ref.r, ref.idx, 0)
			}
		}
		c.unprotectBatch()
		c.sock.drop()
		return
	}
	c.ev.sent(c.a.opts.Now()) // when it went, not the turn's time: the throttle counts from it
}

// protectDirty write-protects the dirty pages of run, adjacent victims of
// r, one WRITEPROTECT per run of dirty neighbours, so that a write while
// the helper copies them faults to us. Clean victims are write-protected
// already: a clean page is installed protected, and the first write to it
// is a WP fault that makes it dirty (page states, pagetable.go); protecting
// them again would cost an ioctl and a TLB flush of the program's CPUs
// each, for nothing (random victims make runs of one or two pages).
//
// Not for a client with a fault ring: its helper write-protects the dirty
// victims itself, after it has checked them against the pins of the system
// calls in flight (preload/src/pin.c), and keeps the pinned ones (EBUSY)
// unprotected. Protected here, a pinned page would stay so while the call
// runs, and the kernel's write into it (read(2), a signal frame on an
// alternate stack) would fail with EFAULT, since its fault raises SIGBUS
// for no one. A write between this choice and the helper's protection
// loses nothing: the page is dirty, and the helper copies it after.
func (c *client) protectDirty(r *region, run []Victim) error {
	for i := 0; i < len(run); {
		if !needsWrite(r, run[i].Page) {
			i++
			continue
		}
		j := i + 1
		for j < len(run) && needsWrite(r, run[j].Page) {
			j++
		}
		rg := userfaultfd.Range{Start: r.addr(run[i].Page), Len: uint64(j-i) * pageSize}
		if err := c.uffd.WriteProtect(rg); err != nil {
			// ESRCH: the process is exiting (its uffd outlives its mm
			// until the loop sees it go), not worth a warning a run.
			if !userfaultfd.IsMMChanged(err) && !userfaultfd.IsGone(err) {
				c.log.Warn("write-protect of victims failed", zap.Stringer("range", rg), zap.Error(err))
			}
			return err
		}
		if r.kind == proto.KindShared {
			// And in every process that maps the segment.
			if err := c.a.shm.protectShared(r, run[i].Page, j-i); err != nil {
				c.log.Debug("write-protect of shared victims failed", zap.Error(err))
				if i > 0 { // the pages before this run (it lifted its own): run is adjacent pages
					c.a.shm.unprotectShared(r, run[0].Page, i)
				}
				return err
			}
		}
		i = j
	}
	return nil
}

// slotsFor takes a pool slot for each dirty victim, in c.ev.newSlots in the
// victims' order, and returns the victims that can be evicted: all of
// them, or without the dirty ones beyond the slots the pool had (they stay
// resident; their reference bit is spent). With none left, eviction pauses
// until the pool has room again (onRoom wakes the loop) or noRoomPause.
func (c *client) slotsFor(victims []Victim, now time.Time) []Victim {
	dirty := 0
	for _, v := range victims {
		if needsWrite(c.regs.list[v.Table], v.Page) {
			dirty++
		}
	}
	got := c.a.slots.tryAlloc(c.ev.newSlots[:dirty])
	if got < dirty && c.a.slots.copiesOverBound() {
		// A slab more would hold more than the bound: this client's
		// copies of clean pages give the slots, at once.
		c.letGo(max(dirty-got, localTrimMin))
	}
	if got < dirty {
		got += c.a.slots.alloc(c.ev.newSlots[got:dirty])
	}
	if got == dirty {
		c.room.again(now, &c.st, c.log)
		return victims
	}
	kept, d := victims[:0], 0
	for _, v := range victims {
		if needsWrite(c.regs.list[v.Table], v.Page) {
			if d == got {
				c.regs.tables[v.Table][v.Page] &^= FlagBusy
				continue
			}
			d++
		}
		kept = append(kept, v)
	}
	c.room.short(now, len(kept) == 0, &c.st, c.log)
	return kept
}

// needsWrite reports whether resident page idx of r must be written to
// the pool when evicted: it is dirty, or (defensively) the pool has no copy.
func needsWrite(r *region, idx int) bool {
	// A segment of shared memory is written through other mappings than
	// the one whose page table this is: every page is written back.
	return r.pages[idx].Has(FlagDirty) || r.slots[idx] == 0 || r.kind == proto.KindShared
}

// evicted finishes an eviction batch: the client copied the first Done
// victims to their staging slots and dropped them. Dirty ones are written
// to every replica; then held faults are served (from the slots while they
// still hold the data) and the slots are freed.
func (c *client) evicted(m *proto.Evicted, now time.Time) {
	if !c.ev.evictBusy || m.Batch != c.ev.evict.Batch {
		c.log.Warn("EVICTED for a batch not in flight", zap.Uint64("batch", m.Batch))
		return
	}
	c.ev.evictBusy = false
	done := min(int(m.Done), c.ev.evict.N)
	// Nothing could be evicted now: a traced client's tracer keeps every
	// page while it brings them all back (package traced, before a fork),
	// or a ring client's system calls have pinned its victims (their
	// buffers, made present first: a call's buffers may be more than the
	// budget holds). Its faults must not wait for evictions that keep
	// nothing, so the budget bends until one evicts a page.
	pinned := m.Errno == unix.EBUSY && (c.says(proto.HelloTraced) || c.ring != nil)
	c.ev.kept = pinned && done == 0
	switch {
	case pinned:
		// A system call has the page after the last one done pinned
		// (preload/src/pin.c), or a traced program's tracer is making
		// its pages resident (package traced, before a fork): kept, as
		// a page in use is.
		c.log.Debug("client kept pinned pages", zap.Int("done", done), zap.Int("of", c.ev.evict.N))
	case m.Errno != 0:
		c.log.Warn("client could not evict every page", zap.Int("done", done), zap.Int("of", c.ev.evict.N), zap.Error(m.Errno))
	}
	c.ev.wb, c.ev.wbRef = c.ev.wb[:0], c.ev.wbRef[:0]
	for i := 0; i < c.ev.evict.N; i++ {
		ref := c.ev.evictRefs[i]
		slot := int(c.ev.evict.Pages[i].Slot)
		hasSlot := c.ev.evict.Pages[i].Slot != proto.NoSlot
		r, idx := ref.r, ref.idx
		if r.gone {
			if hasSlot {
				c.freeStage(slot)
			}
			continue
		}
		p := r.pages[idx] &^ FlagBusy
		if i >= done || p.State() != Resident {
			// Not evicted (still mapped, and write-protected), or
			// dropped by the program meanwhile (REGION_ZAP): Absent.
			if i == done && m.Errno == unix.EBUSY && c.ring != nil {
				p |= FlagRef // pinned: in use by a system call, so not the next victim
			}
			r.pages[idx] = p
			if hasSlot {
				c.freeStage(slot)
				c.setSlot(r, idx, 0) // the pool slot taken for it (dropPage released it already)
			}
			continue
		}
		c.st.evictions.Add(1)
		if hasSlot { // dirty when chosen (busy since: no write got in)
			c.set(r, idx, p.Evicted(Staged))
			c.ev.staged++
			slab, off := c.a.slots.where(r.slots[idx])
			c.ev.wb = append(c.ev.wb, remote.PageOp{Slab: slab, Off: off, Buf: c.ev.stageBuf(slot)})
			c.ev.wbRef = append(c.ev.wbRef, i)
		} else {
			c.set(r, idx, p.Evicted(Remote))
		}
	}
	if len(c.ev.wb) > 0 {
		c.ev.writeBack(c.a.ctx, c.io)
		for j := range c.ev.wb {
			ref := c.ev.evictRefs[c.ev.wbRef[j]]
			if err := c.ev.wb[j].Err; err != nil {
				c.log.Warn("write-back failed; page kept in its staging slot and retried", zap.Error(err))
				continue
			}
			c.ev.staged--
			c.st.writeBacks.Add(1)
			c.set(ref.r, ref.idx, ref.entry().With(Remote))
		}
	}
	c.unprotectBatch()
	c.resolveHeld(now)
	// The batch's staging slots go back, but for a page whose write-back
	// failed (Staged: retried from its slot). Not only Remote pages': a
	// page brought back meanwhile from the pool (a held fault's READ
	// prefetched it) needs its slot no more than one served from it, and
	// a slot kept would serve its next held fault (resolveHeld) these
	// bytes, however often the page was written since: a lost write.
	for i := 0; i < done; i++ {
		ref := c.ev.evictRefs[i]
		if c.ev.evict.Pages[i].Slot == proto.NoSlot {
			continue
		}
		slot := int(c.ev.evict.Pages[i].Slot)
		if c.ev.stageOwner[slot] == ref && (ref.r.gone || ref.entry().State() != Staged) {
			c.freeStage(slot)
		}
	}
	c.checkState(true)
}

// resolveHeld serves the faults that waited for the eviction, at now.
func (c *client) resolveHeld(now time.Time) {
	keep := c.fq.held[:0]
	for _, h := range c.fq.held {
		r, idx := h.r, h.idx
		if r.gone {
			c.uffd.Wake(pageRange(r.addr(idx)))
			continue
		}
		p := r.pages[idx]
		switch {
		case p.Has(FlagBusy):
			keep = append(keep, h)
		case p.State() == Remote && c.ev.stageOf(r, idx) >= 0:
			// The slot still holds the data the pool now has. The page
			// comes back resident: past the budget's margin it waits
			// as any fault does (throttle). (A READ of it that a held
			// fault before this one prefetched is not held back as a
			// sample when it arrives: holdIn.)
			if c.throttle(h.since, now) {
				c.hold(&c.fq.retry, h)
				continue
			}
			if err := c.fromStage(r, idx, userfaultfd.WriteProtected); userfaultfd.IsMMChanged(err) {
				c.hold(&c.fq.retry, h) // served from the pool then
			} else {
				c.observeFault(h.since)
			}
		default:
			c.fault(r.addr(idx), h.flags, h.since, now)
		}
	}
	c.fq.held = keep
	c.flushReads(now, now)
}

// retryWriteBack writes Staged pages whose write-back failed.
func (c *client) retryWriteBack() {
	if c.ev.staged == 0 {
		return
	}
	c.ev.wb, c.ev.wbRef = c.ev.wb[:0], c.ev.wbRef[:0]
	for s, o := range c.ev.stageOwner {
		if o.r == nil || o.r.gone || o.entry().State() != Staged || o.entry().Has(FlagBusy) {
			continue
		}
		if len(c.ev.wb) == cap(c.ev.wb) {
			break
		}
		slab, off := c.poolAt(o)
		c.ev.wb = append(c.ev.wb, remote.PageOp{Slab: slab, Off: off, Buf: c.ev.stageBuf(s)})
		c.ev.wbRef = append(c.ev.wbRef, s)
	}
	if len(c.ev.wb) == 0 {
		return
	}
	c.ev.writeBack(c.a.ctx, c.io)
	for j := range c.ev.wb {
		if c.ev.wb[j].Err != nil {
			continue
		}
		s := c.ev.wbRef[j]
		o := c.ev.stageOwner[s]
		c.ev.staged--
		c.st.writeBacks.Add(1)
		c.set(o.r, o.idx, o.entry().With(Remote))
		c.freeStage(s)
	}
}

// unprotectBatch lifts the protection of the shared memory victims of the
// batch in flight in the processes that map their segment (protectShared),
// a run of adjacent pages at a time. The pages are punched out of the file
// by then (or kept, resident): a write that waited faults them back, or
// goes through.
func (c *client) unprotectBatch() {
	for i := 0; i < c.ev.evict.N; {
		ref := c.ev.evictRefs[i]
		j := i + 1
		for j < c.ev.evict.N && c.ev.evictRefs[j].r == ref.r && c.ev.evictRefs[j].idx == c.ev.evictRefs[j-1].idx+1 {
			j++
		}
		if ref.r.kind == proto.KindShared {
			c.a.shm.unprotectShared(ref.r, ref.idx, j-i)
		}
		i = j
	}
}
