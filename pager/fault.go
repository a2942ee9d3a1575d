package pager

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
	"rmem/userfaultfd"
)

// Fault resolution: a fault's page found, fetched (READ batches merged
// into runs), installed, poisoned or held; the budget's throttle.

type readRef struct {
	pageRef
	prefetch bool
	// write: installed writable and dirty, not write-protected: a write
	// fault asked for it, or its region's fetched pages are mostly
	// written soon after (writeRate.likely); either way a WP fault,
	// a round trip through the agent, would follow at once.
	write  bool
	sample bool // held back (sample.go)
	// marker: held back as its window's read-ahead marker (sample.go),
	// unless a fault wants it by the time it arrives; end is the page
	// its hit prefetches from.
	marker bool
	end    int
	since  time.Time // when the fault that wants it began (zero: a prefetch)
}

// heldBack reports whether read k of the batch, arrived, stays in a slot
// instead of being installed.
func (c *client) heldBack(k int) bool {
	ref := &c.fq.readAt[k]
	return ref.sample || ref.marker && ref.prefetch && c.fq.reads[k].Err == nil
}

type heldFault struct {
	pageRef
	flags userfaultfd.FaultFlags
	since time.Time
}

// throttle reports whether a fault that adds a resident page must wait:
// the client is a batch past its budget (budgetMargin). While an eviction
// is in flight the fault waits for it, until it has been in flight for
// maxThrottle: then the budget bends rather than stall a client whose
// helper cannot run (a Go client whose every P is held by a thread
// blocked in a fault). Otherwise no
// eviction could start (the pool has no room for dirty pages and no clean
// one is left, or every staging slot holds a page whose write-back
// failed): the fault waits until one can, however long (back-pressure:
// the budget holds and nothing is lost; docs/pager.md, Budget).
func (c *client) throttle(since time.Time) bool {
	if c.sock.conn == nil || c.forkStalled() {
		return false // nothing evicts this client now
	}
	if int(c.st.resident.Load())+len(c.fq.reads) < c.budgetPages()+budgetMargin {
		return false
	}
	if c.ev.evictBusy {
		// Measured from the EVICT, not from the fault: a fault that
		// waited for room (pool full) must not pass the budget the
		// moment room returns and an eviction starts.
		return time.Since(c.ev.evictSent) < maxThrottle
	}
	if to := c.a.opts.FaultTimeout; to > 0 && time.Since(since) >= to && !c.a.slots.full() {
		// Not a full pool but an unreachable one (write-backs fail, or
		// the coordinator does not answer): the program must not hang,
		// so the budget bends (no page is lost: the evicted ones wait
		// in their staging slots).
		if !c.room.bentSaid {
			c.room.bentSaid = true
			c.log.Warn("the pool does not answer: the program goes over its budget rather than wait any longer",
				zap.Int("pid", int(c.pidAtm.Load())), zap.Duration("fault_timeout", to))
		}
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

// budgetPages is the client's budget of resident pages.
func (c *client) budgetPages() int { return c.a.budgetPages(c.localMem.Load()) }

// errForkAhead: a FORK event has been read and is not handled yet.
// Reading it ended the kernel's refusal (EAGAIN) of ioctls that install
// pages, but a page installed now would be the parent's alone (the child's
// page tables were copied when the event was raised) while the child's
// copy of our page table, made when the event is handled, would say it is
// mapped: the child would read zeros there. This holds for the faults read
// with the event too: the kernel hands faults out before events, so a
// batch's faults come before its FORK although their pages were missing
// when the child's page tables were copied. So nothing is installed until
// every FORK read is handled, as if the kernel still refused.
var errForkAhead = fmt.Errorf("pager: a FORK event read is not handled yet: %w", unix.EAGAIN)

// gatedUFFD is a client's uffd whose ioctls that install pages (Copy,
// ZeroPage, Poison) fail with errForkAhead while a FORK event it has read
// is not handled (forkHandled): the one place that keeps the rule of
// errForkAhead.
type gatedUFFD struct {
	faultFD
	forks int // FORK events read and not handled yet
}

// ReadEvents reads messages as faultFD does, counting the FORK events.
func (g *gatedUFFD) ReadEvents(msgs []userfaultfd.Msg) (int, error) {
	n, err := g.faultFD.ReadEvents(msgs)
	for i := range msgs[:max(n, 0)] {
		if msgs[i].Kind() == userfaultfd.EventFork {
			g.forks++
		}
	}
	return n, err
}

// forkHandled says a FORK event read has been handled (or dropped).
func (g *gatedUFFD) forkHandled() {
	if g.forks > 0 {
		g.forks--
	}
}

// forkAhead reports whether a FORK event read is not handled yet.
func (g *gatedUFFD) forkAhead() bool { return g.forks > 0 }

func (g *gatedUFFD) Copy(dst userfaultfd.Addr, src []byte, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	return g.faultFD.Copy(dst, src, flags)
}

func (g *gatedUFFD) ZeroPage(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	return g.faultFD.ZeroPage(r, flags)
}

func (g *gatedUFFD) Poison(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	return g.faultFD.Poison(r, flags)
}

// again reports whether an ioctl refused with EAGAIN is worth retrying at
// once. The kernel refuses while a REMOVE/UNMAP event of the client (its
// helper's madvise, a munmap) is unread: reading the pending messages now
// (handled later, in order, by serveUFFD) lifts that, so the page just
// fetched is installed instead of being fetched again on a later retry.
// Not when a FORK is among them (errForkAhead).
func (c *client) again(err error) bool {
	if !userfaultfd.IsMMChanged(err) || c.uffd.forkAhead() || len(c.fq.early) == cap(c.fq.early) {
		return false
	}
	n, rerr := c.uffd.ReadEvents(c.fq.early[len(c.fq.early):cap(c.fq.early)])
	if rerr != nil || n == 0 {
		return false
	}
	c.fq.early = c.fq.early[:len(c.fq.early)+n]
	return !c.uffd.forkAhead()
}

// fault handles one page fault at page address a.
func (c *client) fault(a userfaultfd.Addr, flags userfaultfd.FaultFlags, since time.Time) {
	r, idx := c.regs.find(a)
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
			c.st.latency.Observe(time.Since(since))
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
	if st := p.State(); (st == Absent || st == Remote || st == Staged) && c.throttle(since) {
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
			c.demand(r, idx, since, write) // in this batch already: its install wakes the thread
			return
		}
		if p.Has(FlagSampled) && c.sampleHit(r, idx, flags, since) {
			return
		}
		c.addRead(r, idx, false, write)
		c.fq.readAt[len(c.fq.readAt)-1].since = since
		c.prefetch(r, idx, write)
	case Staged:
		if err := c.fromStage(r, idx, 0); userfaultfd.IsMMChanged(err) {
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
			return
		}
		c.st.latency.Observe(time.Since(since))
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
func (c *client) prefetch(r *region, idx int, write bool) {
	if r.pf == nil {
		return
	}
	n := r.pf.Fault(int64(idx), int64(len(r.pages)), c.fq.pfOut)
	room := c.prefetchRoom()
	base, added := len(c.fq.readAt), 0
	for _, q := range c.fq.pfOut[:n] {
		qp := r.pages[q]
		if room <= 0 {
			break
		}
		if qp.State() == Remote && qp&(FlagFetch|FlagBusy|FlagSampled) == 0 {
			room--
			c.addRead(r, int(q), true, write)
			c.st.prefetchIssued.Add(1)
			added++
		}
	}
	// The window's marker, half of it from its far end (sample.go);
	// not if the batch was flushed meanwhile (the window is split).
	if added >= minMarkWindow && len(c.fq.readAt) == base+added {
		m := &c.fq.readAt[base+added-1-added/2]
		m.marker, m.end = true, c.fq.readAt[base+added-1].idx
	}
}

// prefetchRoom is how many pages may be brought in ahead of faults:
// prefetching stops at the budget's margin, as faults do (throttle).
func (c *client) prefetchRoom() int {
	return c.budgetPages() + budgetMargin - int(c.st.resident.Load()) - len(c.fq.reads)
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
	c.st.latency.Observe(time.Since(since))
	return true
}

// zeroFill maps the zero page at a. It returns err nil when the page is
// mapped, with mapped true if this call mapped it (false: it was mapped
// before, EEXIST, and the thread is woken), else the error (IsMMChanged:
// retry after reading events; IsGone: nothing to do).
func (c *client) zeroFill(a userfaultfd.Addr, since time.Time) (mapped bool, err error) {
	_, err = c.uffd.ZeroPage(pageRange(a), 0)
	if c.again(err) {
		_, err = c.uffd.ZeroPage(pageRange(a), 0)
	}
	switch {
	case err == nil:
		mapped = true
		c.st.zeroFills.Add(1)
	case userfaultfd.IsExist(err):
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsMMChanged(err), userfaultfd.IsGone(err):
		return false, err
	default:
		c.log.Error("zeropage failed", zap.Stringer("addr", a), zap.Error(err))
		return false, err
	}
	c.st.latency.Observe(time.Since(since))
	return mapped, nil
}

func (c *client) hold(list *[]heldFault, h heldFault) {
	// A fault can come again while it is held (a signal interrupted the
	// thread's wait, and it faulted anew: the Go runtime preempts every
	// 10 ms): one entry per page, as old as the first fault, so that a
	// wait is bounded from when it began (FaultTimeout).
	for i := range *list {
		if e := &(*list)[i]; e.pageRef == h.pageRef {
			if h.since.Before(e.since) {
				e.since = h.since
			}
			e.flags |= h.flags
			return
		}
	}
	if list == &c.fq.held {
		c.st.held.Add(1)
	}
	if len(*list) == cap(*list) {
		// Full: let the thread fault again later.
		c.uffd.Wake(pageRange(h.addr()))
		return
	}
	*list = append(*list, h)
}

// addRead queues a READ of page idx of r into the batch; write: see
// readRef.write (a prefetched page is also installed writable when its
// region's fetched pages are mostly written soon after).
func (c *client) addRead(r *region, idx int, prefetch, write bool) {
	if len(c.fq.reads) == cap(c.fq.reads) {
		c.flushReads(time.Now())
	}
	k := len(c.fq.reads)
	slab, off := c.a.slots.where(r.slots[idx])
	c.fq.reads = append(c.fq.reads, remote.PageOp{Slab: slab, Off: off, Buf: c.fq.bufs[k*pageSize : (k+1)*pageSize]})
	c.fq.readAt = append(c.fq.readAt, readRef{pageRef: pageRef{r, idx}, prefetch: prefetch, write: write || prefetch && r.wr.likely()})
	r.pages[idx] |= FlagFetch
}

// demand marks the READ of page idx of r in this batch as wanted by a
// fault, not only prefetched: if it cannot be installed, the fault is held
// for a retry rather than left waiting for a wake-up that never comes.
func (c *client) demand(r *region, idx int, since time.Time, write bool) {
	for k := range c.fq.readAt {
		if c.fq.readAt[k].r == r && c.fq.readAt[k].idx == idx {
			c.fq.readAt[k].prefetch = false
			c.fq.readAt[k].write = c.fq.readAt[k].write || write
			if c.fq.readAt[k].since.IsZero() || since.Before(c.fq.readAt[k].since) {
				c.fq.readAt[k].since = since
			}
			return
		}
	}
}

// flushReads posts the batch of READs and installs what arrived.
func (c *client) flushReads(since time.Time) {
	if len(c.fq.reads) == 0 {
		return
	}
	c.sortReads()
	c.merge()
	c.io.Read(c.a.ctx, c.fq.merged)
	spreadErrs(c.fq.reads, c.fq.merged, c.fq.mergedAt)
	// The sample, when one is due, is the batch's last prefetched page:
	// a stream's next fault comes past it anyway, and its hit (sampleHit)
	// prefetches on as that fault would.
	last, due := -1, false
	for k := range c.fq.reads {
		if c.fq.reads[k].Err == nil && c.fq.readAt[k].prefetch && !c.fq.readAt[k].marker {
			last = k
			due = c.sample.sampleNow() || due
		}
	}
	if due {
		c.fq.readAt[last].sample = true
	}
	for k := 0; k < len(c.fq.reads); {
		if c.fq.readAt[k].sample {
			c.holdSample(k)
			k++
			continue
		}
		if c.heldBack(k) {
			c.holdMarker(k)
			k++
			continue
		}
		// A run of pages that arrived and are adjacent in the client is
		// installed with one UFFDIO_COPY (their buffers are adjacent too):
		// the ioctl costs ~5.5 µs for one page, ~1.5 µs a page for 64.
		j := k + 1
		for j < len(c.fq.reads) && c.fq.reads[k].Err == nil && c.fq.reads[j].Err == nil && !c.heldBack(j) &&
			c.fq.readAt[j].r == c.fq.readAt[k].r && c.fq.readAt[j].idx == c.fq.readAt[j-1].idx+1 &&
			c.fq.readAt[j].write == c.fq.readAt[k].write {
			j++
		}
		if j-k > 1 {
			k += c.copyRun(k, j, since)
		}
		for ; k < j; k++ {
			c.installRead(k, since)
		}
	}
	c.fq.reads = c.fq.reads[:0]
	c.fq.readAt = c.fq.readAt[:0]
}

// sortReads puts the batch's reads in address order, each with the buffer
// of its new place, unless they are in order already: a stream that runs
// down (glibc's memmove copies large buffers from the end) prefetches
// pages in descending order, and only reads in ascending order merge into
// one READ of a run and install with one UFFDIO_COPY. Nothing has been
// read yet: a read is its page (readAt) and what follows from it.
func (c *client) sortReads() {
	at := c.fq.readAt
	if slices.IsSortedFunc(at, cmpReadRef) {
		return
	}
	slices.SortFunc(at, cmpReadRef)
	for k := range at {
		slab, off := c.a.slots.where(at[k].slot())
		c.fq.reads[k] = remote.PageOp{Slab: slab, Off: off, Buf: c.fq.bufs[k*pageSize : (k+1)*pageSize]}
	}
}

func cmpReadRef(a, b readRef) int { return cmp.Compare(a.addr(), b.addr()) }

// merge joins the batch's reads into c.fq.merged: a run of reads of adjacent
// pages of one region whose slots are adjacent in one slab (an eviction
// batch takes consecutive slots for the sorted victims, so a run evicted
// together is one run in the pool; their buffers are adjacent too) is one
// READ, so that a prefetched stream moves in a few large transfers rather
// than many 4 KiB ones (measured on the sequential benchmark: a 32-page
// batch took ~150 µs as 32 READs).
func (c *client) merge() {
	c.fq.merged, c.fq.mergedAt = c.fq.merged[:0], c.fq.mergedAt[:0]
	for k := 0; k < len(c.fq.reads); {
		j := k + 1
		for j < len(c.fq.reads) && c.fq.readAt[j].r == c.fq.readAt[k].r && c.fq.readAt[j].idx == c.fq.readAt[j-1].idx+1 &&
			c.fq.reads[j].Slab == c.fq.reads[k].Slab && c.fq.reads[j].Off == c.fq.reads[j-1].Off+pageSize {
			j++
		}
		c.fq.merged = append(c.fq.merged, remote.PageOp{Slab: c.fq.reads[k].Slab, Off: c.fq.reads[k].Off, Buf: c.fq.bufs[k*pageSize : j*pageSize]})
		c.fq.mergedAt = append(c.fq.mergedAt, k)
		k = j
	}
}

// spreadErrs sets each op's Err from the run it went in: runs[r] carried
// ops[at[r]:at[r+1]] (merge, writeBack).
func spreadErrs(ops, runs []remote.PageOp, at []int) {
	for r, run := range runs {
		end := len(ops)
		if r+1 < len(at) {
			end = at[r+1]
		}
		for k := at[r]; k < end; k++ {
			ops[k].Err = run.Err
		}
	}
}

// copyRun installs reads [k, j), adjacent pages of one region, with one
// Copy, and returns how many it installed: all, or the pages before the
// one where the Copy stopped (the caller installs the rest one by one).
func (c *client) copyRun(k, j int, since time.Time) int {
	first := c.fq.readAt[k]
	n, err := c.uffd.Copy(first.addr(), c.fq.bufs[k*pageSize:j*pageSize], installFlags(first.write))
	done := j - k
	if err != nil {
		done = min(max(n, 0)/pageSize, j-k)
	}
	for m := k; m < k+done; m++ {
		ref := c.fq.readAt[m]
		p := ref.entry() &^ FlagFetch
		c.st.remoteReads.Add(1)
		c.installed(ref.r, ref.idx, p, ref.write)
		if !ref.prefetch {
			c.st.latency.Observe(time.Since(since))
		}
	}
	return done
}

// installRead installs read k of the batch, or poisons or retries it.
func (c *client) installRead(k int, since time.Time) {
	op := &c.fq.reads[k]
	ref := c.fq.readAt[k]
	if !ref.since.IsZero() {
		since = ref.since // a retried fault: its wait began then
	}
	r, idx := ref.r, ref.idx
	p := r.pages[idx] &^ FlagFetch
	r.pages[idx] = p
	switch {
	case op.Err == nil:
		c.st.remoteReads.Add(1)
		var start time.Time // timed for a waiting thread only: no clock read per prefetched page
		if !ref.prefetch {
			start = time.Now()
		}
		err := c.install(r, idx, p, op.Buf, ref.write)
		switch {
		case ref.prefetch:
		case err != nil:
			c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since}) // timed when the retry installs it
		default:
			now := time.Now()
			c.st.install.Observe(now.Sub(start))
			c.st.latency.Observe(now.Sub(since))
		}
	case errors.Is(op.Err, remote.ErrLost):
		c.set(r, idx, p.With(Lost))
		c.setSlot(r, idx, 0) // its data is gone
		if err := c.poison(r, idx); err != nil && !ref.prefetch {
			c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
		}
	default:
		if ref.prefetch {
			return
		}
		if c.unreachableTooLong(since, op.Err) {
			// No replica answered for FaultTimeout: the program gets
			// SIGBUS, never zeros (its page may still exist somewhere,
			// but it cannot wait forever).
			c.set(r, idx, p.With(Lost))
			c.setSlot(r, idx, 0)
			if err := c.poison(r, idx); err != nil {
				c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
			}
			return
		}
		c.st.retries.Add(1)
		c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
	}
}

// unreachableTooLong reports whether a fault waiting since since for a
// page no replica of which answers (err) has waited FaultTimeout: then it
// is given up. It says so once per client when a fault first waits 5 s,
// and when it gives up.
func (c *client) unreachableTooLong(since time.Time, err error) bool {
	waited := time.Since(since)
	limit := c.a.opts.FaultTimeout
	if waited >= stuckWarn && c.room.stuckSaid.IsZero() {
		c.room.stuckSaid = time.Now()
		c.log.Warn("a fault waits for the pool: no replica of its page answers; the program gets SIGBUS if none does in time",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Duration("waited", waited.Round(time.Millisecond)),
			zap.Duration("fault_timeout", limit), zap.Error(err))
	}
	if limit <= 0 || waited < limit {
		return false
	}
	if !c.room.gaveUp {
		c.room.gaveUp = true
		c.log.Error("PAGES LOST TO THE PROGRAM: no replica answered within the fault timeout; its faults on them get SIGBUS",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Duration("fault_timeout", limit), zap.Error(err))
	}
	return true
}

// stuckWarn is how long a fault waits for an unreachable pool before the
// agent says so.
const stuckWarn = 5 * time.Second

// install maps buf at page idx of r, write-protected (clean until a WP
// fault says otherwise) unless write (then dirty from the start: see
// readRef.write), and makes p, the page's entry, Resident and referenced
// (prefetched pages too: the stream is about to use them, CLOCK must not
// take them first). It returns nil as well when the page's range is gone;
// another error means nothing was installed (IsMMChanged: retry after
// reading events).
func (c *client) install(r *region, idx int, p Page, buf []byte, write bool) error {
	a := r.addr(idx)
	_, err := c.uffd.Copy(a, buf, installFlags(write))
	if c.again(err) {
		_, err = c.uffd.Copy(a, buf, installFlags(write))
	}
	switch {
	case err == nil:
		c.installed(r, idx, p, write)
	case userfaultfd.IsExist(err):
		// Mapped already, not by us: a child forked without FORK
		// events inherited it, after the copy of our page table that
		// FORK_PREPARE made, and may have written it. Dirty: its
		// contents go to the pool when it is evicted.
		c.dirty(r, idx, p.With(Resident)|FlagRef)
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsGone(err):
	default:
		return err
	}
	return nil
}

func installFlags(write bool) userfaultfd.Flags {
	if write {
		return 0
	}
	return userfaultfd.WriteProtected
}

// installed records page idx of r, whose entry was p, as mapped from the
// pool: clean (its pool copy kept) or, installed writable, dirty (the copy
// let go: it is written when evicted).
func (c *client) installed(r *region, idx int, p Page, write bool) {
	if write {
		c.dirty(r, idx, p.With(Resident)|FlagRef)
		return
	}
	r.wr.fetchedClean()
	c.set(r, idx, p.With(Resident)|FlagRef)
}

// poison makes page idx raise SIGBUS: every replica of its data is gone.
// An IsMMChanged error means: retry after reading events.
func (c *client) poison(r *region, idx int) error {
	a := r.addr(idx)
	if c.features.Has(userfaultfd.FeaturePoison) {
		c.st.lost.Add(1) // before the ioctl wakes the thread into its SIGBUS
		_, err := c.uffd.Poison(pageRange(a), 0)
		if userfaultfd.IsMMChanged(err) {
			c.st.lost.Add(^uint64(0))
			return err
		}
		c.log.Error("PAGE LOST: every replica of an evicted page is gone; the client gets SIGBUS",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Stringer("addr", a), zap.Uint64("region", r.id))
		if err == nil || userfaultfd.IsExist(err) || userfaultfd.IsGone(err) {
			if err != nil {
				c.uffd.Wake(pageRange(a))
			}
			return nil
		}
		c.log.Error("poison failed", zap.Error(err))
	} else {
		c.st.lost.Add(1)
		c.log.Error("PAGE LOST: every replica of an evicted page is gone; the client gets SIGBUS (no UFFDIO_POISON: the process is killed)",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Stringer("addr", a), zap.Uint64("region", r.id))
	}
	// Never let the thread see zeros: stop the process.
	if pid := int(c.pidAtm.Load()); pid > 0 {
		unix.Kill(pid, unix.SIGBUS)
	}
	return nil
}

// fromStage installs a page from its staging slot and frees the slot.
func (c *client) fromStage(r *region, idx int, flags userfaultfd.Flags) error {
	slot := c.stageOf(r, idx)
	if slot < 0 {
		c.log.Error("staged page without a slot", zap.Uint64("region", r.id), zap.Int("page", idx))
		return nil
	}
	a := r.addr(idx)
	_, err := c.uffd.Copy(a, c.ev.stageBuf(slot), flags)
	exist := userfaultfd.IsExist(err)
	switch {
	case err == nil:
	case exist:
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsGone(err):
	default:
		if !userfaultfd.IsMMChanged(err) {
			c.log.Error("copy from staging failed", zap.Error(err))
		}
		return err
	}
	p := r.pages[idx]
	if p.State() == Staged {
		c.ev.staged--
	}
	if p.State() == Staged || exist { // mapped already, not by us: see installRead
		c.dirty(r, idx, p.With(Resident)|FlagRef) // a Staged page's slot was never written
	} else {
		c.set(r, idx, p.With(Resident)|FlagRef)
	}
	c.freeStage(slot)
	return nil
}

// retryHeld serves again the faults whose READ found no replica reachable.
func (c *client) retryHeld() {
	if len(c.fq.retry) == 0 {
		return
	}
	now := time.Now()
	pending := c.fq.retry
	c.fq.retry, c.fq.retrySpare = c.fq.retrySpare[:0], pending
	for _, h := range pending {
		if !h.r.gone {
			c.fault(h.addr(), h.flags, h.since)
		}
	}
	c.flushReads(now)
}

// sampleHit serves a fault on a held-back page from its slot, counts the
// hit and prefetches on as the stream's fault there; it reports false if
// the page must be read as any other (its flag cleared then).
func (c *client) sampleHit(r *region, idx int, flags userfaultfd.FaultFlags, since time.Time) bool {
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
	c.st.latency.Observe(time.Since(since))
	if s >= sampleSlots { // a marker: the next window, from its end
		c.st.readaheadHits.Add(1)
		c.prefetch(r, c.sample.end[s-sampleSlots], flags&userfaultfd.FaultWrite != 0)
		return true
	}
	c.st.prefetchHits.Add(1)
	c.prefetch(r, idx, flags&userfaultfd.FaultWrite != 0)
	return true
}
