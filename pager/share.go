package pager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Slabs shared across a fork. A fork gives the child the parent's slabs
// that hold pooled pages by reference instead of copying them: a process
// with gigabytes in the pool would otherwise fork only after the agent
// copied them all (and found room for them twice). Each side then reads the
// pages it has in the pool from the same slab. Neither may write a shared
// slab, as the other would read the write: before a client writes back a
// dirty page to a shared slab it copies the slab to one of its own
// (unshare). The copy is paid lazily, one slab at a time, by a side that
// writes back; a child that only reads its inherited heap (a Redis BGSAVE)
// copies nothing.
//
// Invariants: a slab is written only by a client whose region is its only
// reference (write-backs follow unshare); a shared slab holds no page that
// is Staged in a region naming it (forkRegion copies such slabs eagerly);
// a slab is freed when its last reference goes (freeRegions).

// slabRefs counts the regions that name a slab, for the slabs that more
// than one region names; a slab missing from the map has one. Safe for
// concurrent use: the loops of a parent and its children share it.
type slabRefs struct {
	mu   sync.Mutex
	refs map[SlabID]int
}

// share adds a reference to id.
func (s *slabRefs) share(id SlabID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs == nil {
		s.refs = map[SlabID]int{}
	}
	s.refs[id] = max(s.refs[id], 1) + 1
}

// shared reports whether more than one region names id.
func (s *slabRefs) shared(id SlabID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refs[id] > 1
}

// release drops one reference to each of ids, and returns those (in ids'
// backing array) that no region names any more: the caller frees them.
func (s *slabRefs) release(ids []SlabID) []SlabID {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := ids[:0]
	for _, id := range ids {
		switch n := s.refs[id]; {
		case n > 2:
			s.refs[id] = n - 1
		case n == 2:
			delete(s.refs, id)
		default:
			free = append(free, id)
		}
	}
	return free
}

// unshareFor gives each region about to write back a dirty victim to a
// shared slab a copy of that slab of its own. On error the eviction waits:
// the victims stay resident and unchanged.
func (c *client) unshareFor(victims []Victim) error {
	spp := int(c.a.pagesPerSlab)
	for _, v := range victims {
		r := c.regs.list[v.Table]
		s := v.Page / spp
		if id := r.slabs[s]; id != 0 && r.pages[v.Page].Has(FlagDirty) && c.a.slabs.shared(id) {
			if err := c.unshare(r, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyChunk bounds one transfer of a slab copy.
const copyChunk = 64 * pageSize

// pooledCopy reports whether p's data is in its slab for the region that
// holds p: a page in the pool, or a clean resident one (its eviction will
// drop it, trusting the pool's copy).
func pooledCopy(p Page) bool {
	return p.State() == Remote || p.State() == Resident && !p.Has(FlagDirty)
}

// copyPages copies, from slab from to slab to, the pages of r's slab s
// for which want holds, in runs of up to copyChunk. For a run whose every
// replica is gone it calls lost with the run's pages and goes on; another
// failure ends it with an error.
func (c *client) copyPages(ctx context.Context, r *region, s int, from, to SlabID, want func(Page) bool, lost func(lo, hi int)) error {
	if c.copyBuf == nil {
		c.copyBuf = make([]byte, copyChunk)
	}
	spp := int(c.a.pagesPerSlab)
	base, end := s*spp, min((s+1)*spp, len(r.pages))
	var op [1]PageOp
	for idx := base; idx < end; {
		if !want(r.pages[idx]) {
			idx++
			continue
		}
		run := idx + 1
		for run < end && run-idx < copyChunk/pageSize && want(r.pages[run]) {
			run++
		}
		op[0] = PageOp{Slab: from, Off: uint64(idx-base) * pageSize, Buf: c.copyBuf[:(run-idx)*pageSize]}
		c.io.Read(ctx, op[:])
		switch err := op[0].Err; {
		case errors.Is(err, ErrLost):
			lost(idx, run)
		case err != nil:
			return err
		default:
			op[0].Slab = to
			if c.io.Write(ctx, op[:]); op[0].Err != nil {
				return op[0].Err
			}
		}
		idx = run
	}
	return nil
}

// unshare replaces r's shared slab s with one of its own holding what r
// needs of the shared one: the pages r has in the pool or clean (a slab is
// 64 MiB by default; the pages r holds dirty, never wrote or lost need no
// copy). Pages whose every replica is gone are lost in the copy too
// (Remote ones become Lost; clean resident ones dirty, as the pool no
// longer has them).
func (c *client) unshare(r *region, s int) error {
	old := r.slabs[s]
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	defer cancel()
	ids, err := c.a.opts.Store.Alloc(ctx, 1)
	if err != nil {
		return fmt.Errorf("a slab of its own for a shared one: %w", err)
	}
	c.roomAgain()
	err = c.copyPages(ctx, r, s, old, ids[0], pooledCopy, func(lo, hi int) {
		for k := lo; k < hi; k++ {
			if p := r.pages[k]; p.State() == Remote {
				c.set(r, k, p.With(Lost))
			} else {
				r.pages[k] = p | FlagDirty
			}
		}
	})
	if err != nil {
		c.a.freeSlabs(ids)
		return fmt.Errorf("copying a shared slab: %w", err)
	}
	r.slabs[s] = ids[0]
	c.a.freeSlabs(c.a.slabs.release([]SlabID{old})) // nothing, unless the other side let go meanwhile
	c.st.unshares.Add(1)
	c.log.Debug("copied a slab shared with a fork", zap.Uint64("region", r.id), zap.Int("slab", s))
	return nil
}
