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

// unshareFor keeps from victims those that may be evicted now: not a
// dirty page of a shared slab, which waits for the slab's unshare (started
// here if none is in progress: one at a time, a chunk per pass of the
// loop, so that faults are served meanwhile). Deferred victims stay
// resident. On error (no slab for the copy) the victims are returned
// unchanged and the eviction waits.
func (c *client) unshareFor(victims []Victim) ([]Victim, error) {
	spp := int(c.a.pagesPerSlab)
	kept := victims[:0]
	for i, v := range victims {
		r := c.regs.list[v.Table]
		s := v.Page / spp
		if !r.pages[v.Page].Has(FlagDirty) || !c.unsharing(r, s) && (r.slabs[s] == 0 || !c.a.slabs.shared(r.slabs[s])) {
			kept = append(kept, v)
			continue
		}
		if c.unsh == nil {
			if err := c.startUnshare(r, s); err != nil {
				return append(kept, victims[i:]...), err
			}
		}
		r.pages[v.Page] &^= FlagBusy
	}
	return kept, nil
}

// slabCopy is an unshare in progress: region r's shared slab s is copied
// to slab to, a chunk per pass of the loop (stepUnshare); pages of the
// slab before next are done. Until it ends, r names the shared slab (its
// faults read there) and no dirty page of the slab is written back.
type slabCopy struct {
	r     *region
	s     int
	to    SlabID
	next  int       // page index
	retry time.Time // after a failed chunk
	// An eviction found only victims that wait for this copy: none is
	// tried again until it ends.
	blocking bool
}

func (c *client) unsharing(r *region, s int) bool {
	return c.unsh != nil && c.unsh.r == r && c.unsh.s == s
}

// startUnshare begins copying r's shared slab s to a slab of its own.
func (c *client) startUnshare(r *region, s int) error {
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	defer cancel()
	ids, err := c.a.opts.Store.Alloc(ctx, 1)
	if err != nil {
		return fmt.Errorf("a slab of its own for a shared one: %w", err)
	}
	c.roomAgain()
	c.unsh = &slabCopy{r: r, s: s, to: ids[0], next: s * int(c.a.pagesPerSlab)}
	return nil
}

// unshareReady reports whether an unshare has a chunk to copy now.
func (c *client) unshareReady() bool {
	return c.unsh != nil && !time.Now().Before(c.unsh.retry)
}

// stepUnshare copies the next chunk of the unshare in progress: what the
// region needs of the shared slab (the pages it has in the pool or clean:
// a slab is 64 MiB by default; pages it holds dirty, never wrote or lost
// need no copy), as they are when the chunk is copied. Pages whose every
// replica is gone are lost in the copy too (Remote ones become Lost; clean
// resident ones dirty, as the pool no longer has them). After the last
// chunk the region names its copy, and the shared slab loses a reference.
// A copy is dropped if the region went away or the slab is no longer
// shared (the other side let go: the region may write it now).
func (c *client) stepUnshare() {
	u := c.unsh
	if u == nil || time.Now().Before(u.retry) {
		return
	}
	r := u.r
	spp := int(c.a.pagesPerSlab)
	end := min((u.s+1)*spp, len(r.pages))
	if !c.a.slabs.shared(r.slabs[u.s]) {
		c.dropUnshare()
		return
	}
	old := r.slabs[u.s]
	ctx, cancel := context.WithTimeout(c.a.ctx, 30*time.Second)
	defer cancel()
	hi := min(u.next+copyChunk/pageSize, end)
	err := c.copyPages(ctx, r, u.s, u.next, hi, old, u.to, pooledCopy, func(lo, hi int) {
		n := loseRun(r.pages, lo, hi)
		c.count(Remote, -int64(n))
		c.count(Lost, int64(n))
	})
	if err != nil {
		if u.retry.IsZero() { // said once per copy
			c.log.Warn("copying a shared slab failed; trying again every 200 ms", zap.Uint64("region", r.id), zap.Int("slab", u.s), zap.Error(err))
		}
		u.retry = time.Now().Add(noRoomPause)
		return
	}
	if u.next = hi; u.next < end {
		return
	}
	r.slabs[u.s] = u.to
	c.unsh = nil
	c.a.freeSlabs(c.a.slabs.release([]SlabID{old})) // nothing, unless the other side let go meanwhile
	c.st.unshares.Add(1)
	c.log.Debug("copied a slab shared with a fork", zap.Uint64("region", r.id), zap.Int("slab", u.s))
}

// dropUnshare abandons the unshare in progress and frees its copy.
func (c *client) dropUnshare() {
	if c.unsh != nil {
		c.a.freeSlabs([]SlabID{c.unsh.to})
		c.unsh = nil
	}
}

// loseRun marks pages [lo, hi) of a table whose copy found every replica
// gone: those in the pool are Lost (SIGBUS, never zeros), clean resident
// ones dirty (the pool no longer has them). It returns how many became
// Lost.
func loseRun(pages PageTable, lo, hi int) int {
	n := 0
	for idx := lo; idx < hi; idx++ {
		switch p := pages[idx]; p.State() {
		case Remote:
			pages[idx] = p.With(Lost)
			n++
		case Resident:
			pages[idx] = p | FlagDirty
		}
	}
	return n
}

// copyChunk bounds one transfer of a slab copy.
const copyChunk = 64 * pageSize

// pooledCopy reports whether p's data is in its slab for the region that
// holds p: a page in the pool, or a clean resident one (its eviction will
// drop it, trusting the pool's copy).
func pooledCopy(p Page) bool {
	return p.State() == Remote || p.State() == Resident && !p.Has(FlagDirty)
}

// copyPages copies, from slab from to slab to, the pages [lo, hi) of r
// (in its slab s) for which want holds: each copyChunk of them with one
// batch of READs (a run of adjacent pages is one READ) and one of WRITEs.
// For a run whose every replica is gone it calls lost with the run's pages
// and goes on; another failure ends it with an error.
func (c *client) copyPages(ctx context.Context, r *region, s, lo, hi int, from, to SlabID, want func(Page) bool, lost func(lo, hi int)) error {
	if c.copyBuf == nil {
		c.copyBuf = make([]byte, copyChunk)
		c.copyOps = make([]PageOp, 0, copyChunk/pageSize/2+1)
	}
	base := s * int(c.a.pagesPerSlab)
	for chunk := lo; chunk < hi; chunk += copyChunk / pageSize {
		end := min(chunk+copyChunk/pageSize, hi)
		ops := c.copyOps[:0]
		for idx := chunk; idx < end; {
			if !want(r.pages[idx]) {
				idx++
				continue
			}
			run := idx + 1
			for run < end && want(r.pages[run]) {
				run++
			}
			ops = append(ops, PageOp{Slab: from, Off: uint64(idx-base) * pageSize, Buf: c.copyBuf[(idx-chunk)*pageSize : (run-chunk)*pageSize]})
			idx = run
		}
		if len(ops) == 0 {
			continue
		}
		c.io.Read(ctx, ops)
		got := ops[:0]
		for _, op := range ops {
			switch idx := base + int(op.Off/pageSize); {
			case errors.Is(op.Err, ErrLost):
				lost(idx, idx+len(op.Buf)/pageSize)
			case op.Err != nil:
				return op.Err
			default:
				op.Slab = to
				got = append(got, op)
			}
		}
		c.io.Write(ctx, got)
		for _, op := range got {
			if op.Err != nil {
				return op.Err
			}
		}
	}
	return nil
}
