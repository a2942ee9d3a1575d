package pager

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

// fork handles a FORK event: fd is the child's uffd. The child becomes a
// client of its own, served at once (its first faults may come before its
// HELLO). Its page tables start as copies of the parent's; resident pages
// are the child's own copy-on-write pages (dirty: they have no pool copy
// yet); pages in the pool are copied to slabs of the child's own, so that
// later write-backs of either process never show through to the other
// (private-memory semantics, DESIGN.md pitfall 2). The child is paired with
// its HELLO by (parent pid, fork serial).
func (c *client) fork(fd int) {
	c.forks++
	serial := c.forks
	u, err := userfaultfd.FromFD(fd, c.features)
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
	child.localMem.Store(c.localMem.Load()) // its HELLO may say otherwise
	// EVICTED replies sent before fork(2) are queued already: finish
	// those evictions so the copy below sees settled pages.
	c.drainSocket()
	for _, r := range c.regs.list {
		cr, err := c.forkRegion(child, r)
		if err != nil {
			c.log.Error("copying a region for the forked child failed; its evicted pages are lost to the child",
				zap.Uint64("region", r.id), zap.Error(err))
		}
		child.regs.add(cr)
		child.st.regions.Add(1)
	}
	c.a.addForkChild(int(c.pidAtm.Load()), serial, child)
}

// forkRegion returns the child's copy of r.
func (c *client) forkRegion(child *client, r *region) (*region, error) {
	cr := &region{
		id: r.id, start: r.start, kind: r.kind,
		pages: make(PageTable, len(r.pages)),
		slabs: make([]SlabID, len(r.slabs)),
	}
	if r.pf != nil {
		cr.pf = NewPrefetcher(32, c.a.opts.MaxPrefetch)
	}
	spp := int(c.a.pagesPerSlab)
	var firstErr error
	for s := range r.slabs {
		lo, hi := s*spp, min((s+1)*spp, len(r.pages))
		need := false
		for idx := lo; idx < hi; idx++ {
			p := r.pages[idx]
			switch p.State() {
			case Resident:
				// Busy pages too: the helper had not dropped them before
				// fork, so the child has them mapped.
				child.set(cr, idx, Page(0).With(Resident)|FlagDirty)
			case Remote, Staged:
				need = true
			case Lost:
				child.set(cr, idx, Page(0).With(Lost))
			}
		}
		if !need {
			continue
		}
		if err := c.copySlab(child, r, cr, s); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return cr, firstErr
}

// copySlab copies the pooled pages of slab s of r to a new slab of cr.
func (c *client) copySlab(child *client, r, cr *region, s int) error {
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	defer cancel()
	spp := int(c.a.pagesPerSlab)
	lo, hi := s*spp, min((s+1)*spp, len(r.pages))
	ids, err := c.a.opts.Store.Alloc(ctx, 1)
	if err != nil {
		for idx := lo; idx < hi; idx++ {
			if st := r.pages[idx].State(); st == Remote || st == Staged {
				child.set(cr, idx, Page(0).With(Lost))
			}
		}
		return err
	}
	cr.slabs[s] = ids[0]
	ops := make([]PageOp, 0, maxBatch)
	idxs := make([]int, 0, maxBatch)
	buf := make([]byte, maxBatch*pageSize)
	flush := func() {
		if len(ops) == 0 {
			return
		}
		// READ what is in the parent's slab (staged pages are copied from
		// their slots below), then WRITE all to the child's.
		for k := range ops {
			ops[k].Slab = r.slabs[s]
		}
		rd := make([]PageOp, 0, len(ops))
		for k := range ops {
			if r.pages[idxs[k]].State() == Remote {
				rd = append(rd, ops[k])
			}
		}
		c.io.Read(ctx, rd)
		// No replica reachable right now is not lost: try again a few
		// times before the child's copy of those pages is given up
		// (poisoned: loud, never zeros).
		for try := 0; try < 3 && ctx.Err() == nil; try++ {
			retry := rd[:0:0]
			for k := range rd {
				if errors.Is(rd[k].Err, ErrUnavailable) {
					retry = append(retry, rd[k])
				}
			}
			if len(retry) == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
			c.io.Read(ctx, retry)
			m := 0
			for k := range rd {
				if errors.Is(rd[k].Err, ErrUnavailable) {
					rd[k].Err = retry[m].Err
					m++
				}
			}
		}
		lost := map[int]bool{}
		j := 0
		for k := range ops {
			idx := idxs[k]
			if r.pages[idx].State() == Remote {
				if rd[j].Err != nil {
					lost[idx] = true
				}
				j++
				continue
			}
			if slot := c.slotOf(r, idx); slot >= 0 {
				copy(ops[k].Buf, c.staging[slot*pageSize:(slot+1)*pageSize])
			}
		}
		for k := range ops {
			ops[k].Slab = cr.slabs[s]
		}
		c.io.Write(ctx, ops)
		for k := range ops {
			idx := idxs[k]
			if lost[idx] || ops[k].Err != nil {
				child.set(cr, idx, Page(0).With(Lost))
			} else {
				child.set(cr, idx, Page(0).With(Remote))
			}
		}
		ops, idxs = ops[:0], idxs[:0]
	}
	for idx := lo; idx < hi; idx++ {
		st := r.pages[idx].State()
		if st != Remote && st != Staged {
			continue
		}
		k := len(ops)
		ops = append(ops, PageOp{Off: uint64(idx%spp) * pageSize, Buf: buf[k*pageSize : (k+1)*pageSize]})
		idxs = append(idxs, idx)
		if len(ops) == cap(ops) {
			flush()
		}
	}
	flush()
	return nil
}
