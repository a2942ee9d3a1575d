package pager

import (
	"slices"
	"time"

	"go.uber.org/zap"

	"rmem/pager/remote"
	"rmem/userfaultfd"
)

// The owner's side of shared memory (shared.go): the steps of its loop
// that serve the proxies' holes and bring segments back into their files.

// unpageSegments writes the pages in the pool of the segments no process
// maps any more, and of those released (sharedTable.release), back into
// their files, and drops them (the owner's loop: c). A segment mapped
// again meanwhile stays paged, unless released. With an eviction in
// flight, the next turn does it.
func (c *client) unpageSegments() {
	if !c.a.shm.isOwner(c) {
		return
	}
	t := c.a.shm
	t.mu.Lock()
	if len(t.unpaging) == 0 {
		t.mu.Unlock()
		return
	}
	segs := slices.Clone(t.unpaging)
	t.mu.Unlock()
	for _, s := range segs {
		r := s.reg
		t.mu.Lock()
		mapped := len(s.mappers) > 0 && s.released == nil
		t.mu.Unlock()
		if mapped || r == nil || r.gone {
			t.doneUnpaging(s, false)
			continue
		}
		if c.ev.evictBusy {
			return // its pages may be in flight
		}
		r.pinned = true // evicted no more
		lost, err := c.writeBackToFile(r)
		if err != nil {
			c.log.Error("bringing a shared memory segment back into its file failed: its pages in the pool are lost", zap.Error(err))
			lost = nil
			for idx, p := range r.pages {
				if p.State() != Resident {
					lost = append(lost, idx)
				}
			}
		}
		if len(lost) > 0 {
			c.log.Error("PAGES LOST: a shared memory segment brought back into its file lacks pages no replica held: its mappings get SIGBUS there, and it may not be opened or read outside the agent (EPERM)", zap.Int("pages", len(lost)))
			t.markLost(s, lost)
		}
		t.doneUnpaging(s, true)
	}
}

// writeBackToFile puts r's pages that are not resident (in the pool, or
// in a staging slot) back into its segment's file, installed into the
// owner's mapping (UFFDIO_COPY: a SysV segment's file has no write), READ
// a batch at a time into the loop's read buffers. It returns the pages
// that were lost.
func (c *client) writeBackToFile(r *region) (lost []int, err error) {
	var ops [maxBatch]remote.PageOp
	var at [maxBatch]int
	n := 0
	put := func(idx int, buf []byte) error {
		_, err := c.uffd.Copy(r.addr(idx), buf, 0)
		if c.again(err) {
			_, err = c.uffd.Copy(r.addr(idx), buf, 0)
		}
		if err != nil && !userfaultfd.IsExist(err) {
			return err
		}
		c.installed(r, idx, r.pages[idx], true) // resident, dirty (counted, its slot let go)
		return nil
	}
	flush := func() error {
		c.io.Read(c.a.ctx, ops[:n])
		for i, op := range ops[:n] {
			if op.Err != nil {
				lost = append(lost, at[i])
				continue
			}
			if err := put(at[i], op.Buf); err != nil {
				return err
			}
		}
		n = 0
		return nil
	}
	for idx, p := range r.pages {
		switch p.State() {
		case Remote:
			slab, off := c.a.slots.where(r.slots[idx])
			ops[n], at[n] = remote.PageOp{Slab: slab, Off: off, Buf: c.rd.bufs[n*pageSize : (n+1)*pageSize]}, idx
			if n++; n == maxBatch {
				if err := flush(); err != nil {
					return lost, err
				}
			}
		case Staged:
			if err := c.fromStage(r, idx, 0); err != nil {
				return lost, err
			}
		case Lost:
			lost = append(lost, idx)
		}
	}
	return lost, flush()
}

// serveHoles serves the holes proxies posted, and those still waiting, as
// faults of the owner's pages (the owner's loop: c). A page comes back as
// any fault's does (a READ, a staging slot, the zero page; held while it
// is being evicted, or past the budget), into the file; wakeHoles wakes
// the proxies' threads once it is there.
func (c *client) serveHoles(now time.Time) {
	if !c.a.shm.isOwner(c) {
		return
	}
	t := c.a.shm
	defer c.answerZaps()
	t.mu.Lock()
	for _, h := range t.holes {
		if h.done != nil {
			c.fq.zapped = append(c.fq.zapped, h.done)
		}
		r := h.seg.reg
		switch {
		case r == nil || r.gone:
		case h.zap > 0:
			for idx := h.off / pageSize; idx < min(h.off+h.zap, h.seg.size())/pageSize; idx++ {
				if r.pages[idx].State() != Absent {
					c.dropPage(r, int(idx))
				}
			}
		default:
			c.fq.holes = append(c.fq.holes, h)
		}
	}
	t.holes = t.holes[:0]
	t.mu.Unlock()
	if len(c.fq.holes) == 0 {
		return
	}
	for _, h := range c.fq.holes {
		if r := h.seg.reg; r != nil && !r.gone && r.pages[h.off/pageSize].State() != Lost {
			c.fault(r.addr(int(h.off/pageSize)), h.flags, h.since, now)
		}
	}
	c.flushReads(now, now)
	c.wakeHoles() // those installed: before this turn's eviction
}

// answerZaps lets the punches this turn forgot go ahead.
func (c *client) answerZaps() {
	for _, d := range c.fq.zapped {
		close(d)
	}
	clear(c.fq.zapped)
	c.fq.zapped = c.fq.zapped[:0]
}

// wakeHoles wakes the proxies' threads whose pages are in the file now
// (resident in the owner, not being evicted), or raises SIGBUS for lost
// ones; the others wait for the next turn.
func (c *client) wakeHoles() {
	if len(c.fq.holes) == 0 {
		return
	}
	t := c.a.shm
	keep := c.fq.holes[:0]
	t.mu.Lock()
	for _, h := range c.fq.holes {
		r := h.seg.reg
		var p Page
		if r != nil && !r.gone {
			p = r.pages[h.off/pageSize]
		}
		live := slices.Contains(h.seg.mappers, h.r)
		switch {
		case !live:
		case r == nil || r.gone:
			h.r.px.c.uffd.faultFD.Wake(pageRange(h.a)) // faults again: lost, or a new segment
		case p.State() == Lost:
			h.r.px.c.poisonLost(h.a)
		case p.State() == Resident && !p.Has(FlagBusy):
			h.r.px.c.uffd.faultFD.Wake(pageRange(h.a))
		default:
			keep = append(keep, h)
		}
	}
	t.mu.Unlock()
	c.fq.holes = keep
}
