package pager

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// maybeEvict starts an eviction batch when resident pages are past the
// high watermark: CLOCK picks victims, they are write-protected (a write
// from now on faults to us and waits) and named in an EVICT to the
// client's helper thread, dirty ones with a staging slot to copy them to,
// clean ones (the pool has them) without. One batch is in flight at a
// time. Victims are sorted so that adjacent ones share a WRITEPROTECT
// here and a MADV_DONTNEED in the helper.
func (c *client) maybeEvict() {
	if c.conn == nil || c.evictBusy || c.forkStalled() || len(c.slotFree) == 0 || time.Now().Before(c.noRoomRetry) ||
		c.unsh != nil && c.unsh.blocking {
		return
	}
	w := WatermarksFor(c.budgetPages())
	need := w.ToEvict(int(c.st.resident.Load()), 0)
	if need <= 0 {
		return
	}
	need = min(need, proto.MaxEvictBatch, len(c.slotFree))
	n := c.clock.Victims(c.regs.tables, c.victims[:need])
	if n == 0 {
		return
	}
	victims := c.victims[:n]
	slices.SortFunc(victims, func(a, b Victim) int {
		if a.Table != b.Table {
			return a.Table - b.Table
		}
		return a.Page - b.Page
	})
	victims, err := c.unshareFor(victims)
	if err == nil {
		err = c.ensureSlabs(victims)
	}
	if err != nil {
		// Said once, and tried again after a pause rather than on every
		// pass of the loop (each try asks the coordinator).
		if c.noRoomSince.IsZero() {
			c.log.Error("no remote memory for eviction; staying over budget", zap.Error(err))
			c.noRoomSince = time.Now()
		}
		c.noRoomRetry = time.Now().Add(noRoomPause)
		for _, v := range victims {
			c.regs.tables[v.Table][v.Page] &^= FlagBusy
		}
		return
	}
	if len(victims) == 0 {
		// Every victim waits for the unshare: CLOCK would only go
		// round them again until it ends.
		c.unsh.blocking = true
		return
	}

	k := 0
	for i := 0; i < len(victims); {
		r := c.regs.list[victims[i].Table]
		j := i + 1
		for j < len(victims) && victims[j].Table == victims[i].Table && victims[j].Page == victims[j-1].Page+1 {
			j++
		}
		// One WRITEPROTECT per run of adjacent victims.
		run := userfaultfd.Range{Start: r.addr(victims[i].Page), Len: uint64(j-i) * pageSize}
		if err := c.uffd.WriteProtect(run); err != nil {
			if !userfaultfd.IsMMChanged(err) {
				c.log.Warn("write-protect of victims failed", zap.Stringer("range", run), zap.Error(err))
			}
			for _, v := range victims[i:j] {
				r.pages[v.Page] &^= FlagBusy
			}
			i = j
			continue
		}
		for _, v := range victims[i:j] {
			slot := proto.NoSlot
			if r.pages[v.Page].Has(FlagDirty) {
				slot = c.slotFree[len(c.slotFree)-1]
				c.slotFree = c.slotFree[:len(c.slotFree)-1]
				c.slotOwner[slot] = pageRef{r, v.Page}
			}
			c.evict.Pages[k] = proto.EvictPage{Addr: r.addr(v.Page), Slot: slot}
			c.evictRefs[k] = pageRef{r, v.Page}
			k++
		}
		i = j
	}
	if k == 0 {
		return
	}
	c.evictSeq++
	c.evict.Batch, c.evict.N = c.evictSeq, k
	c.seq++
	if err := proto.Send(c.conn, c.sendBuf, c.seq, &c.evict); err != nil {
		c.log.Warn("sending EVICT failed; eviction stops until the client reconnects", zap.Error(err))
		for i := 0; i < k; i++ {
			ref := c.evictRefs[i]
			ref.r.pages[ref.idx] &^= FlagBusy
			if s := c.evict.Pages[i].Slot; s != proto.NoSlot {
				c.freeSlot(int(s))
			}
		}
		c.dropConn()
		return
	}
	c.evictBusy = true
}

// noRoomPause is how long eviction waits after the pool had no room for it.
const noRoomPause = 200 * time.Millisecond

// roomAgain notes that the pool gave slabs again after it had none.
func (c *client) roomAgain() {
	if !c.noRoomSince.IsZero() {
		c.log.Info("remote memory for eviction again", zap.Duration("over budget for", time.Since(c.noRoomSince)))
		c.noRoomSince = time.Time{}
	}
}

// ensureSlabs allocates the slabs the victims' pages live in.
func (c *client) ensureSlabs(victims []Victim) error {
	spp := int(c.a.pagesPerSlab)
	missing := 0
	for _, v := range victims {
		r := c.regs.list[v.Table]
		if r.slabs[v.Page/spp] == 0 {
			r.slabs[v.Page/spp] = ^SlabID(0) // counted once
			missing++
		}
	}
	if missing == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	ids, err := c.a.opts.Store.Alloc(ctx, missing)
	cancel()
	if err == nil {
		c.roomAgain()
	}
	for _, v := range victims {
		r := c.regs.list[v.Table]
		s := v.Page / spp
		if r.slabs[s] == ^SlabID(0) {
			if err != nil {
				r.slabs[s] = 0
				continue
			}
			r.slabs[s], ids = ids[0], ids[1:]
		}
	}
	return err
}

// evicted finishes an eviction batch: the client copied the first Done
// victims to their staging slots and dropped them. Dirty ones are written
// to every replica; then held faults are served (from the slots while they
// still hold the data) and the slots are freed.
func (c *client) evicted(m *proto.Evicted) {
	if !c.evictBusy || m.Batch != c.evict.Batch {
		c.log.Warn("EVICTED for a batch not in flight", zap.Uint64("batch", m.Batch))
		return
	}
	// A client that asked for REMOVE events (the shim and the Go client
	// do not): the batch's REMOVE events (its madvise) were read before it
	// sent EVICTED, but may wait in c.early (read ahead by again): handle
	// them while the pages are still busy, so they do not drop the
	// contents just saved.
	if len(c.early) > 0 {
		c.serveUFFD()
	}
	c.evictBusy = false
	done := min(int(m.Done), c.evict.N)
	if m.Errno != 0 {
		c.log.Warn("client could not evict every page", zap.Int("done", done), zap.Int("of", c.evict.N), zap.Error(m.Errno))
	}
	c.wb, c.wbRef = c.wb[:0], c.wbRef[:0]
	spp := int(c.a.pagesPerSlab)
	for i := 0; i < c.evict.N; i++ {
		ref := c.evictRefs[i]
		slot := int(c.evict.Pages[i].Slot)
		hasSlot := c.evict.Pages[i].Slot != proto.NoSlot
		r, idx := ref.r, ref.idx
		if r.gone {
			if hasSlot {
				c.freeSlot(slot)
			}
			continue
		}
		p := r.pages[idx] &^ FlagBusy
		if i >= done || p.State() != Resident {
			// Not evicted (still mapped, and write-protected), or
			// dropped by the program meanwhile (REGION_ZAP): Absent.
			r.pages[idx] = p
			if hasSlot {
				c.freeSlot(slot)
			}
			continue
		}
		c.st.evictions.Add(1)
		if hasSlot { // dirty when chosen (busy since: no write got in)
			c.set(r, idx, (p &^ (FlagDirty | FlagRef)).With(Staged))
			c.staged++
			c.wb = append(c.wb, PageOp{Slab: r.slabs[idx/spp], Off: uint64(idx%spp) * pageSize,
				Buf: c.staging[slot*pageSize : (slot+1)*pageSize]})
			c.wbRef = append(c.wbRef, i)
		} else {
			c.set(r, idx, (p &^ FlagRef).With(Remote))
		}
	}
	if len(c.wb) > 0 {
		c.io.Write(c.a.ctx, c.wb)
		for j := range c.wb {
			ref := c.evictRefs[c.wbRef[j]]
			if err := c.wb[j].Err; err != nil {
				c.log.Warn("write-back failed; page kept in its staging slot and retried", zap.Error(err))
				continue
			}
			c.staged--
			c.st.writeBacks.Add(1)
			c.set(ref.r, ref.idx, ref.r.pages[ref.idx].With(Remote))
		}
	}
	c.resolveHeld()
	for i := 0; i < done; i++ {
		ref := c.evictRefs[i]
		if c.evict.Pages[i].Slot == proto.NoSlot {
			continue
		}
		slot := int(c.evict.Pages[i].Slot)
		if c.slotOwner[slot] == ref && !ref.r.gone && ref.r.pages[ref.idx].State() == Remote {
			c.freeSlot(slot)
		}
	}
}

// resolveHeld serves the faults that waited for the eviction.
func (c *client) resolveHeld() {
	now := time.Now()
	keep := c.held[:0]
	for _, h := range c.held {
		r, idx := h.r, h.idx
		if r.gone {
			c.uffd.Wake(pageRange(r.addr(idx)))
			continue
		}
		p := r.pages[idx]
		switch {
		case p.Has(FlagBusy):
			keep = append(keep, h)
		case p.State() == Remote && c.slotOf(r, idx) >= 0:
			// The slot still holds the data the pool now has.
			if err := c.fromSlot(r, idx, userfaultfd.WriteProtected); userfaultfd.IsMMChanged(err) {
				c.hold(&c.retry, h) // served from the pool then
			} else {
				c.st.latency.Observe(time.Since(h.since))
			}
		default:
			c.fault(r.addr(idx), h.flags, h.since)
		}
	}
	c.held = keep
	c.flushReads(now)
}

// retryWriteBack writes Staged pages whose write-back failed.
func (c *client) retryWriteBack() {
	if c.staged == 0 {
		return
	}
	spp := int(c.a.pagesPerSlab)
	c.wb, c.wbRef = c.wb[:0], c.wbRef[:0]
	for s, o := range c.slotOwner {
		if o.r == nil || o.r.gone || o.r.pages[o.idx].State() != Staged || o.r.pages[o.idx].Has(FlagBusy) {
			continue
		}
		if len(c.wb) == cap(c.wb) {
			break
		}
		c.wb = append(c.wb, PageOp{Slab: o.r.slabs[o.idx/spp], Off: uint64(o.idx%spp) * pageSize,
			Buf: c.staging[s*pageSize : (s+1)*pageSize]})
		c.wbRef = append(c.wbRef, s)
	}
	if len(c.wb) == 0 {
		return
	}
	c.io.Write(c.a.ctx, c.wb)
	for j := range c.wb {
		if c.wb[j].Err != nil {
			continue
		}
		s := c.wbRef[j]
		o := c.slotOwner[s]
		c.staged--
		c.st.writeBacks.Add(1)
		c.set(o.r, o.idx, o.r.pages[o.idx].With(Remote))
		c.freeSlot(s)
	}
}
