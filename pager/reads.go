package pager

import (
	"cmp"
	"errors"
	"slices"
	"time"

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

// readBatch is a batch's READs: the ops (reads, each into its page of
// bufs), the page each is for (at, in the same order), and the ops merged
// into runs.
type readBatch struct {
	reads    []remote.PageOp
	at       []readRef
	merged   []remote.PageOp // reads joined into runs (merge)
	mergedAt []int           // first read of each merged op
	bufs     []byte
}

// full reports whether the batch has no room for another READ.
func (b *readBatch) full() bool { return len(b.reads) == cap(b.reads) }

// buf returns the buffers of reads [k, j).
func (b *readBatch) buf(k, j int) []byte { return b.bufs[k*pageSize : j*pageSize] }

// add queues a READ of ref's page from slab at off.
func (b *readBatch) add(ref readRef, slab remote.SlabID, off uint64) {
	k := len(b.reads)
	b.reads = append(b.reads, remote.PageOp{Slab: slab, Off: off, Buf: b.buf(k, k+1)})
	b.at = append(b.at, ref)
}

// reset empties the batch.
func (b *readBatch) reset() {
	b.reads = b.reads[:0]
	b.at = b.at[:0]
}

// heldBack reports whether read k of the batch, arrived, stays in a slot
// instead of being installed.
func (b *readBatch) heldBack(k int) bool {
	ref := &b.at[k]
	return ref.sample || ref.marker && ref.prefetch && b.reads[k].Err == nil
}

// demand marks the READ of page idx of r in this batch as wanted by a
// fault waiting since since (a write: installed writable), not only
// prefetched: if it cannot be installed, the fault is held for a retry
// rather than left waiting for a wake-up that never comes.
func (b *readBatch) demand(r *region, idx int, since time.Time, write bool) {
	for k := range b.at {
		if ref := &b.at[k]; ref.r == r && ref.idx == idx {
			ref.prefetch = false
			ref.write = ref.write || write
			if ref.since.IsZero() || since.Before(ref.since) {
				ref.since = since
			}
			return
		}
	}
}

// sort puts the batch's reads in address order, each with the buffer of
// its new place, unless they are in order already: a stream that runs
// down (glibc's memmove copies large buffers from the end) prefetches
// pages in descending order, and only reads in ascending order merge into
// one READ of a run and install with one UFFDIO_COPY. Nothing has been
// read yet: a read is its page (at) and what follows from it, its slot
// in pool.
func (b *readBatch) sort(pool *slotPool) {
	if slices.IsSortedFunc(b.at, cmpReadRef) {
		return
	}
	slices.SortFunc(b.at, cmpReadRef)
	for k := range b.at {
		slab, off := pool.where(b.at[k].slot())
		b.reads[k] = remote.PageOp{Slab: slab, Off: off, Buf: b.buf(k, k+1)}
	}
}

func cmpReadRef(a, b readRef) int { return cmp.Compare(a.addr(), b.addr()) }

// merge joins the batch's reads into b.merged: a run of reads of adjacent
// pages of one region whose slots are adjacent in one slab (an eviction
// batch takes consecutive slots for the sorted victims, so a run evicted
// together is one run in the pool; their buffers are adjacent too) is one
// READ, so that a prefetched stream moves in a few large transfers rather
// than many 4 KiB ones (measured on the sequential benchmark: a 32-page
// batch took ~150 µs as 32 READs).
func (b *readBatch) merge() {
	b.merged, b.mergedAt = b.merged[:0], b.mergedAt[:0]
	for k := 0; k < len(b.reads); {
		j := k + 1
		for j < len(b.reads) && b.at[j].r == b.at[k].r && b.at[j].idx == b.at[j-1].idx+1 &&
			b.reads[j].Slab == b.reads[k].Slab && b.reads[j].Off == b.reads[j-1].Off+pageSize {
			j++
		}
		b.merged = append(b.merged, remote.PageOp{Slab: b.reads[k].Slab, Off: b.reads[k].Off, Buf: b.buf(k, j)})
		b.mergedAt = append(b.mergedAt, k)
		k = j
	}
}

// addRead queues a READ of page idx of r into the batch; write: see
// readRef.write (a prefetched page is also installed writable when its
// region's fetched pages are mostly written soon after).
func (c *client) addRead(r *region, idx int, prefetch, write bool, now time.Time) {
	if c.rd.full() {
		c.flushReads(now, now)
	}
	slab, off := c.a.slots.where(r.slots[idx])
	c.rd.add(readRef{pageRef: pageRef{r, idx}, prefetch: prefetch, write: write || prefetch && r.wr.likely()}, slab, off)
	r.pages[idx] |= FlagFetch
}

// flushReads posts the batch of READs and installs what arrived. A fault
// that wants a page of a run waited since since (one of its own: since
// that); now is the time of the batch or turn.
func (c *client) flushReads(since, now time.Time) {
	b := &c.rd
	if len(b.reads) == 0 {
		return
	}
	b.sort(c.a.slots)
	b.merge()
	c.io.Read(c.a.ctx, b.merged)
	spreadErrs(b.reads, b.merged, b.mergedAt)
	c.checkRuns()
	// The sample, when one is due, is the batch's last prefetched page:
	// a stream's next fault comes past it anyway, and its hit (sampleHit)
	// prefetches on as that fault would.
	last, due := -1, false
	for k := range b.reads {
		if b.reads[k].Err == nil && b.at[k].prefetch && !b.at[k].marker {
			last = k
			due = c.sample.sampleNow() || due
		}
	}
	if due {
		b.at[last].sample = true
	}
	for k := 0; k < len(b.reads); {
		if b.at[k].sample {
			c.holdSample(k)
			k++
			continue
		}
		if b.heldBack(k) {
			c.holdMarker(k)
			k++
			continue
		}
		// A run of pages that arrived and are adjacent in the client is
		// installed with one UFFDIO_COPY (their buffers are adjacent too):
		// the ioctl costs ~5.5 µs for one page, ~1.5 µs a page for 64.
		j := k + 1
		for j < len(b.reads) && b.reads[k].Err == nil && b.reads[j].Err == nil && !b.heldBack(j) &&
			b.at[j].r == b.at[k].r && b.at[j].idx == b.at[j-1].idx+1 &&
			b.at[j].write == b.at[k].write {
			j++
		}
		if j-k > 1 {
			k += c.copyRun(k, j, since)
		}
		for ; k < j; k++ {
			c.installRead(k, since, now)
		}
	}
	b.reset()
	c.checkState(false)
}

// checkRuns counts the bad copies the batch's READs met (end-to-end
// checksums, pager/slabio), and reads the pages of a run that came back
// ErrCorrupt again one by one: only the pages with no good copy are lost
// (poisoned by installRead), not their run.
func (c *client) checkRuns() {
	b := &c.rd
	for m := range b.merged {
		run := &b.merged[m]
		c.st.checksumErrors.Add(uint64(run.Corrupt))
		k, j := runOps(b.mergedAt, m, len(b.reads))
		if j-k > 1 && errors.Is(run.Err, remote.ErrCorrupt) {
			c.io.Read(c.a.ctx, b.reads[k:j])
		}
	}
}

// copyRun installs reads [k, j), adjacent pages of one region, with one
// Copy, and returns how many it installed: all, or the pages before the
// one where the Copy stopped (the caller installs the rest one by one).
func (c *client) copyRun(k, j int, since time.Time) int {
	b := &c.rd
	first := b.at[k]
	n, err := c.uffd.Copy(first.addr(), c.rd.buf(k, j), installFlags(first.write))
	done := j - k
	if err != nil {
		done = min(max(n, 0)/pageSize, j-k)
	}
	var end time.Time // read once for the run, and only if a thread waits
	for m := k; m < k+done; m++ {
		ref := b.at[m]
		p := ref.entry() &^ FlagFetch
		c.st.remoteReads.Add(1)
		c.installed(ref.r, ref.idx, p, ref.write)
		if !ref.prefetch {
			if end.IsZero() {
				end = c.a.opts.Now()
			}
			c.observeMiss(end.Sub(since))
		}
	}
	return done
}

// installRead installs read k of the batch, or poisons or retries it; a
// fault that waits for it has waited since since (or ref.since), and now
// is the time of the batch or turn (FaultTimeout counts to it).
func (c *client) installRead(k int, since, now time.Time) {
	b := &c.rd
	op := &b.reads[k]
	ref := b.at[k]
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
			start = c.a.opts.Now()
		}
		err := c.install(r, idx, p, op.Buf, ref.write)
		switch {
		case ref.prefetch:
		case err != nil:
			c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since}) // timed when the retry installs it
		default:
			end := c.a.opts.Now()
			c.st.install.Observe(end.Sub(start))
			c.observeMiss(end.Sub(since))
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
		if c.room.giveUp(since, now, c.a.opts.FaultTimeout, op.Err, int(c.pidAtm.Load()), c.log) {
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
