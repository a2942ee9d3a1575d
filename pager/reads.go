package pager

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"

	"rmem/pager/remote"
)

// A batch's READs: queued with the faults and prefetches that want them,
// put in address order, merged into runs, posted together, and installed
// run by run (or held back as samples and markers, poisoned, retried).

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
