package pager

import (
	"time"

	"go.uber.org/zap"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// Fault resolution: a fault's page found and served (zero fill, a READ
// queued with its prefetches, a staging slot, poison), or held; the
// budget's throttle. The batch's READs are reads.go's, installs and held
// faults install.go's.

// throttle reports whether a fault that adds a resident page must wait:
// the client is a batch past its budget (budgetMargin). While an eviction
// is in flight the fault waits for it, until it has been in flight for
// maxThrottle: then the budget bends rather than stall a client whose
// helper cannot run (a Go client whose every P is held by a thread
// blocked in a fault). Otherwise no
// eviction could start (the pool has no room for dirty pages and no clean
// one is left, or every staging slot holds a page whose write-back
// failed): the fault waits until one can, however long (back-pressure:
// the budget holds and nothing is lost; docs/pager.md, Budget). The fault
// has waited since since; now is the time of the batch or turn.
func (c *client) throttle(since, now time.Time) bool {
	if c.sock.conn == nil || c.fk.stalled(now, c.log) {
		return false // nothing evicts this client now
	}
	if int(c.st.resident.Load())+len(c.rd.reads) < c.budgetPages()+budgetMargin {
		return false
	}
	if c.ev.kept {
		return false
	}
	if c.ev.evictBusy {
		return c.ev.throttles(now)
	}
	if to := c.a.opts.FaultTimeout; to > 0 && now.Sub(since) >= to && !c.a.slots.full() {
		// Not a full pool but an unreachable one (write-backs fail, or
		// the coordinator does not answer): the program must not hang,
		// so the budget bends (no page is lost: the evicted ones wait
		// in their staging slots).
		c.room.bent(to, int(c.pidAtm.Load()), c.log)
		return false
	}
	c.st.waits.Add(1)
	return true
}

// budgetMargin is how far past its budget, in pages, a client's resident
// pages may go before its faults wait: one eviction batch (and the READs
// of one fault batch in flight, counted with them).
const budgetMargin = proto.MaxEvictBatch

// BudgetMargin is budgetMargin in bytes: a client's resident paged memory
// stays under its budget plus this (docs/pager.md, Budget).
const BudgetMargin = budgetMargin * pageSize

// fault handles one page fault at page address a.
// It has waited since since (its first read); now is the time of the batch
// or turn that handles it.
func (c *client) fault(a userfaultfd.Addr, flags userfaultfd.FaultFlags, since, now time.Time) {
	r, idx := c.regs.find(a)
	if r != nil && r.px != nil {
		c.a.shm.fault(r, a, flags, since)
		return
	}
	if r == nil {
		// Not a region we know: nothing of it was ever evicted, so this
		// is a first touch.
		if _, err := c.zeroFill(a, since); err != nil {
			c.uffd.Wake(pageRange(a)) // it faults again
		}
		return
	}
	p := r.pages[idx]
	if p.Has(FlagBusy) {
		c.hold(&c.fq.held, heldFault{pageRef{r, idx}, flags, since})
		return
	}
	if flags&userfaultfd.FaultWP != 0 {
		if p.State() == Resident {
			r.wr.written()
			lo, k := r.wa.run(idx, len(r.pages), func(q int) bool {
				qp := r.pages[q]
				return qp.State() == Resident && qp&(FlagBusy|FlagFetch) == 0
			})
			for q := lo; q < lo+k; q++ {
				c.dirty(r, q, r.pages[q]|FlagRef)
			}
			run := userfaultfd.Range{Start: r.addr(lo), Len: uint64(k) * pageSize}
			err := c.uffd.Unprotect(run, 0)
			if c.again(err) {
				err = c.uffd.Unprotect(run, 0)
			}
			if err != nil && !userfaultfd.IsGone(err) {
				if userfaultfd.IsMMChanged(err) {
					c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
					return
				}
				c.log.Error("unprotect failed", zap.Stringer("addr", a), zap.Error(err))
				c.uffd.Wake(pageRange(a))
			}
			c.observeFault(since)
			return
		}
		// A write to a page we do not hold mapped: most often it is
		// not mapped any more (evicted since the fault was raised) and
		// faults again as MISSING once woken. Unprotecting instead of
		// only waking also lets a write through to a page that is mapped
		// after all (a REGION_ZAP whose madvise then failed) instead of
		// faulting forever; it is a no-op on an unmapped page.
		if err := c.uffd.Unprotect(pageRange(a), 0); err != nil {
			c.uffd.Wake(pageRange(a))
		}
		return
	}
	if st := p.State(); (st == Absent || st == Remote || st == Staged) && c.throttle(since, now) {
		c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		return
	}
	switch p.State() {
	case Absent:
		if flags&userfaultfd.FaultWrite != 0 && c.zeroAhead(r, idx, since) {
			return
		}
		// Dirty: a write to the zero page is not seen (no WP on it).
		switch _, err := c.zeroFill(a, since); {
		case err == nil:
			c.set(r, idx, p.With(Resident)|FlagDirty|FlagRef)
		case userfaultfd.IsMMChanged(err):
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		}
	case Resident:
		// A repeated fault (EEXIST: woken), or the page was dropped
		// behind our back (a raw madvise(MADV_DONTNEED) system call, see
		// docs/pager.md): it reads as zeros now.
		switch mapped, err := c.zeroFill(a, since); {
		case mapped:
			c.dirty(r, idx, p|FlagRef)
		case userfaultfd.IsMMChanged(err):
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		}
	case Remote:
		write := flags&userfaultfd.FaultWrite != 0
		if p.Has(FlagFetch) {
			c.rd.demand(r, idx, since, write) // in this batch already: its install wakes the thread
			return
		}
		if p.Has(FlagSampled) && c.sampleHit(r, idx, flags, since, now) {
			return
		}
		c.addRead(r, idx, false, write, now)
		c.rd.at[len(c.rd.at)-1].since = since
		c.prefetch(r, idx, write, now)
	case Staged:
		if err := c.fromStage(r, idx, 0); userfaultfd.IsMMChanged(err) {
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
			return
		}
		c.observeFault(since)
	case Lost:
		if err := c.poison(r, idx); userfaultfd.IsMMChanged(err) {
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		}
	}
}

// prefetch tells r's prefetcher of a fault on page idx and queues the
// READs it asks for. write says the fault was a write: the stream is
// being written (a merge's output, a copy's destination), so its pages
// come back writable (readRef.write), not to take a WP fault each.
func (c *client) prefetch(r *region, idx int, write bool, now time.Time) {
	if r.pf == nil {
		return
	}
	n := r.pf.Fault(int64(idx), int64(len(r.pages)), c.fq.pfOut)
	room := c.prefetchRoom()
	base, added := len(c.rd.at), 0
	for _, q := range c.fq.pfOut[:n] {
		qp := r.pages[q]
		if room <= 0 {
			break
		}
		if qp.State() == Remote && qp&(FlagFetch|FlagBusy|FlagSampled) == 0 {
			room--
			c.addRead(r, int(q), true, write, now)
			c.st.pf.issued.Add(1)
			added++
		}
	}
	// The window's marker, half of it from its far end (sample.go);
	// not if the batch was flushed meanwhile (the window is split).
	if added >= minMarkWindow && len(c.rd.at) == base+added {
		m := &c.rd.at[base+added-1-added/2]
		m.marker, m.end = true, c.rd.at[base+added-1].idx
	}
}

// prefetchRoom is how many pages may be brought in ahead of faults:
// prefetching stops at the budget's margin, as faults do (throttle).
func (c *client) prefetchRoom() int {
	return c.budgetPages() + budgetMargin - int(c.st.resident.Load()) - len(c.rd.reads)
}

// maxZeroAhead bounds the pages one write fault on a never-written page
// maps (zeroAhead): the zero source below.
const maxZeroAhead = 64

// zeroPages is the source of zeroAhead's copies: never written, so it
// costs the agent no memory (its pages read as the zero page).
var zeroPages [maxZeroAhead * pageSize]byte

// zeroAhead serves a write fault on never-written page idx of r, when its
// prefetcher sees a stream (a heap being filled, a buffer written from
// one end) that goes on over never-written pages: those pages and the
// faulting one are mapped writable at once with one UFFDIO_COPY of zeros,
// so the stream takes one fault a run instead of one a page, and no
// copy-on-write of the zero page after each (a first write through
// zeroFill). The pages are dirty, as zeroFill's. It returns false, having
// done nothing, when there is no such run: zeroFill serves the fault.
func (c *client) zeroAhead(r *region, idx int, since time.Time) bool {
	if r.pf == nil {
		return false
	}
	n := r.pf.Fault(int64(idx), int64(len(r.pages)), c.fq.pfOut)
	room := min(c.prefetchRoom(), maxZeroAhead) - 1
	if n == 0 || room <= 0 {
		return false
	}
	// The run from idx along the stream's direction (its first
	// prefetch is the next page, up or down) of never-written pages.
	step := int(c.fq.pfOut[0]) - idx
	if step != 1 && step != -1 {
		return false
	}
	k := 0
	for q := idx + step; k < room && q >= 0 && q < len(r.pages) && r.pages[q] == Page(0).With(Absent); q += step {
		k++
	}
	if k == 0 {
		return false
	}
	lo := idx
	if step < 0 {
		lo = idx - k
	}
	done, err := c.uffd.Copy(r.addr(lo), zeroPages[:(k+1)*pageSize], 0)
	if err != nil {
		done = max(done, 0)
	}
	got := min(done/pageSize, k+1)
	for q := lo; q < lo+got; q++ {
		c.set(r, q, r.pages[q].With(Resident)|FlagDirty|FlagRef)
	}
	c.st.zeroFills.Add(uint64(got))
	if idx >= lo+got {
		return false // the Copy stopped before the faulting page: zeroFill it
	}
	if err != nil {
		c.uffd.Wake(pageRange(r.addr(idx))) // the Copy woke nothing past where it stopped
	}
	c.observeZeroFill(since)
	return true
}

// retryHeld serves again, at now (the turn's time), the faults held for a
// retry: their READ found no replica reachable, their install was
// refused, or they waited at the budget.
func (c *client) retryHeld(now time.Time) {
	if len(c.fq.retry) == 0 {
		return
	}
	for _, h := range c.fq.takeRetry() {
		if !h.r.gone {
			c.fault(h.addr(), h.flags, h.since, now)
		}
	}
	c.flushReads(now, now)
}

// sampleHit serves a fault on a held-back page from its slot, counts the
// hit and prefetches on as the stream's fault there; it reports false if
// the page must be read as any other (its flag cleared then).
func (c *client) sampleHit(r *region, idx int, flags userfaultfd.FaultFlags, since, now time.Time) bool {
	s := -1
	for i, o := range c.sample.owner {
		if o.r == r && o.idx == idx {
			s = i
		}
	}
	p := r.pages[idx] &^ FlagSampled
	if s < 0 { // not expected: a recycled slot clears its page's flag
		r.pages[idx] = p
		return false
	}
	err := c.install(r, idx, p, c.sample.buf[s*pageSize:(s+1)*pageSize], flags&userfaultfd.FaultWrite != 0)
	if userfaultfd.IsMMChanged(err) {
		c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		return true
	}
	c.sample.owner[s] = pageRef{}
	r.pages[idx] &^= FlagSampled // also if not installed (range gone, or refused)
	if err != nil {
		return false
	}
	c.observeFault(since)
	if s >= sampleSlots { // a marker: the next window, from its end
		c.st.pf.readahead.Add(1)
		c.prefetch(r, c.sample.end[s-sampleSlots], flags&userfaultfd.FaultWrite != 0, now)
		return true
	}
	c.st.pf.hits.Add(1)
	c.prefetch(r, idx, flags&userfaultfd.FaultWrite != 0, now)
	return true
}
