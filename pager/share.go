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

// unshareChunk is the transfer size of a slab copy.
const unshareChunk = 64 * pageSize

// unshare replaces r's shared slab s with a copy of its own: every page r
// has in the pool reads the same from the copy. Pages whose every replica
// is gone are lost in the copy too (Remote ones become Lost; clean
// resident ones become dirty, as the pool no longer has them).
func (c *client) unshare(r *region, s int) error {
	old := r.slabs[s]
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	defer cancel()
	ids, err := c.a.opts.Store.Alloc(ctx, 1)
	if err != nil {
		return fmt.Errorf("a slab of its own for a shared one: %w", err)
	}
	c.roomAgain()
	if c.copyBuf == nil {
		c.copyBuf = make([]byte, unshareChunk)
	}
	size := c.a.pagesPerSlab * pageSize
	spp := int(c.a.pagesPerSlab)
	for off := uint64(0); off < size; off += unshareChunk {
		op := []PageOp{{Slab: old, Off: off, Buf: c.copyBuf[:min(unshareChunk, size-off)]}}
		c.io.Read(ctx, op)
		if err := op[0].Err; errors.Is(err, ErrLost) {
			first := s*spp + int(off/pageSize)
			for idx := first; idx < min(first+len(op[0].Buf)/pageSize, len(r.pages)); idx++ {
				switch p := r.pages[idx]; {
				case p.State() == Remote:
					c.set(r, idx, p.With(Lost))
				case p.State() == Resident:
					r.pages[idx] = p | FlagDirty
				}
			}
			continue // the new slab reads zeros there; nothing names them
		} else if err != nil {
			c.a.freeSlabs(ids)
			return fmt.Errorf("copying a shared slab: %w", err)
		}
		op[0].Slab = ids[0]
		c.io.Write(ctx, op)
		if err := op[0].Err; err != nil {
			c.a.freeSlabs(ids)
			return fmt.Errorf("copying a shared slab: %w", err)
		}
	}
	r.slabs[s] = ids[0]
	c.a.freeSlabs(c.a.slabs.release([]SlabID{old})) // nothing, unless the other side let go meanwhile
	c.st.unshares.Add(1)
	c.log.Debug("copied a slab shared with a fork", zap.Uint64("region", r.id), zap.Int("slab", s))
	return nil
}
