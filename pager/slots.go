package pager

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"rmem/pager/remote"
)

// Pool space follows the data: the agent's slabs are carved into page
// slots, and a page takes a slot only when its data goes to the pool (a
// dirty page's write-back), as a kernel's swap slots. Every client of the
// agent takes its slots from one pool, so many small regions (a heap's
// chunks, an interpreter's arenas) share slabs, and a process holds pool
// space for the pages it has paged out, not for the address space of its
// regions. A slot is freed when its data is no longer needed: the page is
// written to again (its pool copy is stale), dropped, unmapped, lost, or its
// process exits.
//
// A slot is counted: a fork gives the child a reference to each of the
// parent's slots instead of copying the data, and neither side ever writes
// a slot while another names it, because a write-back always goes to a slot
// of its own taken for it (copy-on-write at page granularity: nothing is
// copied at the fork, nor later).
//
// The slabs come from the Store off the fault path: RoutineReservoir
// allocates one when free slots run low (lowWater) and gives back empty
// slabs beyond one's worth of slack, and, when freed slots are scattered
// over many slabs (a program freed half its heap), drains the emptiest
// slab: the loops move their pages out of it (relocate) and it is freed.
// So the space held stays within about 1.1x the space used plus one slab.

// Slot names one page-sized place in the pool: page (Slot-1) % pps of the
// agent's slab number (Slot-1) / pps. 0 is no slot.
type Slot uint32

// slotRefMax is the largest count kept in a slot's byte; higher counts
// (a page shared by many forks) live in poolSlab.over.
const slotRefMax = 255

// slotPool is the agent's remote memory as page slots. Its methods are
// safe for concurrent use by the loops and the reservoir. The reservoir's
// decisions (step) take the time as an argument, read from now once a
// round.
type slotPool struct {
	store remote.Store
	pps   int // pages per slab
	low   int // free slots under which the reservoir allocates a slab
	log   *zap.Logger
	now   func() time.Time // the agent's clock (Options.Now)

	mu      sync.Mutex
	slabs   []*poolSlab // by slab number; nil: a number free for reuse
	free    int         // free slots of slabs that take allocations
	used    int         // slots with data (a reference or more)
	extra   int         // references past a slot's first (a fork's sides sharing it)
	next    int         // slab number where alloc looks first
	short   bool        // an alloc came back short since the last new slab
	noRoom  error       // why the last Store.Alloc failed; nil once one worked
	since   time.Time   // when the pool first had no room
	drain   int         // the slab being drained (-1: none)
	asked   time.Time   // the last alloc
	drainAt time.Time
	counts  slotStats

	// view is what the loops read without the lock: slab ids by slab
	// number, and which is draining; replaced on every change.
	view atomic.Pointer[slotView]
	gen  atomic.Uint64 // bumped when a drain starts
	trim trimState

	journal *journal // records which slab is which slot number (nil: none)

	kick   chan struct{}
	onRoom func() // called without mu after a short alloc when slots are free again, and when a drain starts
}

// trimState is the pool's trims. A trim asks the loops to let go of a
// share (share per mille) of their pool copies of clean resident pages,
// when those copies are what makes the space held pass 1.1x the space of
// remote pages plus a slab; gen is bumped with each.
type trimState struct {
	gen    atomic.Uint64
	share  atomic.Uint32
	last   time.Time  // the last trim (under slotPool.mu)
	copies func() int // the clients' pool copies of clean resident pages (not remote)
}

type slotView struct {
	ids   []remote.SlabID
	drain int // slab number being drained, -1 for none
}

type poolSlab struct {
	id remote.SlabID
	// stripe: slots per stripe of an erasure-coded slab (its k, 1 for
	// copies): whole free stripes are taken first (takeStripes).
	stripe int
	// garbage: free slots of stripes that hold a used one (erasure-coded
	// slabs): the servers keep them, and the stripes' parity covers them,
	// until they are taken again (took, freed).
	garbage int
	refs    []uint8
	over    map[int]uint32 // counts above slotRefMax, by page
	used    int
	hint    int // the next page alloc looks at
}

// slotStats counts the reservoir's work.
type slotStats struct {
	allocated, freed, drained, relocated uint64
	allocErrs                            uint64
}

// PoolStats is the agent's pool space: what it holds and what holds data.
type PoolStats struct {
	SlabSize  uint64 `json:"slab_size"`
	Slabs     int    `json:"slabs"`
	HeldBytes uint64 `json:"held_bytes"` // slabs held from the pool
	UsedBytes uint64 `json:"used_bytes"` // slots holding a page's data
	// StoredBytes is what the memory servers hold for those pages: each
	// used slot once per copy of its slab (replicas not lost), counted in
	// page slots, not the free space of slabs held. Under --replicas 2
	// it is about twice UsedBytes.
	StoredBytes uint64 `json:"stored_bytes"`
	// NoRoom is why the pool gave no slab the last time it was asked
	// (empty once it gives again), and NoRoomSince when that began.
	NoRoom      string    `json:"no_room,omitempty"`
	NoRoomSince time.Time `json:"no_room_since,omitzero"`
	// Slabs allocated and freed over the agent's life, slabs emptied by
	// moving their pages out (drains) and the pages moved.
	Allocated uint64 `json:"slabs_allocated"`
	Freed     uint64 `json:"slabs_freed"`
	Drained   uint64 `json:"slabs_drained"`
	Relocated uint64 `json:"pages_relocated"`
}

func newSlotPool(store remote.Store, log *zap.Logger, now func() time.Time) *slotPool {
	pps := int(store.SlabSize() / pageSize)
	p := &slotPool{
		store: store, pps: pps, low: lowWater(pps), log: log, now: now, drain: -1,
		kick: make(chan struct{}, 1), onRoom: func() {},
	}
	p.publishLocked()
	return p
}

// lowWater is the free slots under which a slab is allocated: enough for a
// few eviction batches while the pool answers, and at most about 1/11 of a
// slab, so that the next slab is asked for only once the used space makes
// it fit the 1.1x rule (held <= 1.1 used + a slab).
func lowWater(pps int) int {
	return max(min(1024, pps/12), 2*maxEvictBatch)
}

const maxEvictBatch = 128 // proto.MaxEvictBatch, kept here to size lowWater

func (p *slotPool) publishLocked() {
	v := &slotView{ids: make([]remote.SlabID, len(p.slabs)), drain: p.drain}
	for i, s := range p.slabs {
		if s != nil {
			v.ids[i] = s.id
		}
	}
	p.view.Store(v)
}

// where returns the slab and byte offset of slot s (taken by the caller,
// so its slab is held).
func (p *slotPool) where(s Slot) (remote.SlabID, uint64) {
	i := int(s-1) / p.pps
	v := p.view.Load()
	if s == 0 || i >= len(v.ids) {
		return 0, 0
	}
	return v.ids[i], uint64(int(s-1)%p.pps) * pageSize
}

// draining reports whether s is in the slab being drained.
func (p *slotPool) draining(s Slot) bool {
	d := p.view.Load().drain
	return d >= 0 && s != 0 && int(s-1)/p.pps == d
}

// alloc fills out with new slots (one reference each) and returns how many
// it took: fewer than len(out) when the pool is short, and then the
// reservoir is asked for a slab.
func (p *slotPool) alloc(out []Slot) int { return p.take(out, true) }

// tryAlloc is alloc for a caller that has another way to find room (an
// eviction can let go of its own clean pages' copies, see slotsFor): a
// short take is not reported to the reservoir.
func (p *slotPool) tryAlloc(out []Slot) int { return p.take(out, false) }

func (p *slotPool) take(out []Slot, report bool) int {
	p.mu.Lock()
	p.asked = p.now()
	n := 0
	if p.garbageHighLocked() {
		n = p.takeGarbageLocked(out)
	} else {
		n = p.takeStripesLocked(out)
	}
	for tries := 0; n < len(out) && p.free > 0 && tries <= len(p.slabs); tries++ {
		if p.next >= len(p.slabs) {
			p.next = 0
		}
		s := p.slabs[p.next]
		if s == nil || s.used == p.pps || p.next == p.drain {
			p.next++
			continue
		}
		for ; n < len(out) && s.used < p.pps; s.hint = (s.hint + 1) % p.pps {
			if s.refs[s.hint] == 0 {
				s.refs[s.hint] = 1
				s.used++
				s.took(s.hint)
				out[n] = Slot(p.next*p.pps + s.hint + 1)
				n++
			}
		}
		if s.used == p.pps {
			p.next++
		}
	}
	p.free -= n
	p.used += n
	short := n < len(out) || p.free < p.low
	if !report && n < len(out) {
		p.mu.Unlock()
		return n
	}
	if n < len(out) {
		p.short = true
	}
	p.mu.Unlock()
	if short {
		p.kickReservoir()
	}
	return n
}

// stripeOf returns the slots per stripe of slab id (1 unless the Store
// erasure-codes it).
func (p *slotPool) stripeOf(id remote.SlabID) int {
	if l, ok := p.store.(layouter); ok {
		if _, k, m := l.Layout(id); m > 0 {
			return k
		}
	}
	return 1
}

// takeStripesLocked fills out with the slots of whole free stripes of
// erasure-coded slabs, and returns how many it took. A WRITE that covers
// a stripe needs no READ for its parity; one that fills a stripe in part
// reads the stripe's other pages (pager/slabio, ec.go), so slots freed
// here and there are taken only when no whole stripe is free.
func (p *slotPool) takeStripesLocked(out []Slot) int {
	n := 0
	for i := 0; i < len(p.slabs) && n < len(out); i++ {
		num := (p.next + i) % len(p.slabs)
		s := p.slabs[num]
		if s == nil || s.stripe <= 1 || num == p.drain || p.pps-s.used < s.stripe {
			continue
		}
		k, stripes := s.stripe, p.pps/s.stripe
		first := s.hint / k
		for j := 0; j < stripes && n < len(out); j++ {
			base := ((first + j) % stripes) * k
			free := true
			for _, r := range s.refs[base : base+k] {
				if r != 0 {
					free = false
					break
				}
			}
			if !free {
				continue
			}
			for x := base; x < base+k && n < len(out); x++ {
				s.refs[x] = 1
				s.used++
				s.took(x)
				out[n] = Slot(num*p.pps + x + 1)
				n++
				s.hint = (x + 1) % p.pps
			}
		}
	}
	return n
}

// stripeOfSlot returns the slots of the stripe slot x of s is in.
func (s *poolSlab) stripeOfSlot(x int) []uint8 {
	base := x - x%s.stripe
	return s.refs[base:min(base+s.stripe, len(s.refs))]
}

func usedIn(refs []uint8) int {
	n := 0
	for _, r := range refs {
		if r != 0 {
			n++
		}
	}
	return n
}

// took counts slot x, just taken, out of the garbage (or its stripe's
// other free slots in, if it was free).
func (s *poolSlab) took(x int) {
	if s.stripe <= 1 {
		return
	}
	st := s.stripeOfSlot(x)
	if usedIn(st) == 1 {
		s.garbage += len(st) - 1
	} else {
		s.garbage--
	}
}

// freed counts slot x, just freed, in the garbage (or its stripe's other
// free slots out, if it was the last used one).
func (s *poolSlab) freed(x int) {
	if s.stripe <= 1 {
		return
	}
	st := s.stripeOfSlot(x)
	if usedIn(st) == 0 {
		s.garbage -= len(st) - 1
	} else {
		s.garbage++
	}
}

// garbageHighLocked reports whether the free slots of used stripes pass a
// tenth of the used slots: then they are taken before whole free stripes
// (each such write reads its stripe's other pages for the parity), so
// that what the servers hold stays within about 1.1x (k+m)/k of the pages
// paged out.
func (p *slotPool) garbageHighLocked() bool {
	g := 0
	for _, s := range p.slabs {
		if s != nil {
			g += s.garbage
		}
	}
	return g > 0 && 10*g > p.used
}

// takeGarbageLocked fills out with the free slots of stripes that hold a
// used one, and returns how many it took.
func (p *slotPool) takeGarbageLocked(out []Slot) int {
	n := 0
	for i := 0; i < len(p.slabs) && n < len(out); i++ {
		num := (p.next + i) % len(p.slabs)
		s := p.slabs[num]
		if s == nil || s.stripe <= 1 || num == p.drain || s.garbage == 0 {
			continue
		}
		for base := 0; base < p.pps && n < len(out) && s.garbage > 0; base += s.stripe {
			st := s.refs[base:min(base+s.stripe, p.pps)]
			if usedIn(st) == 0 {
				continue
			}
			for x := range st {
				if n == len(out) {
					break
				}
				if st[x] == 0 {
					st[x] = 1
					s.used++
					s.took(base + x)
					out[n] = Slot(num*p.pps + base + x + 1)
					n++
				}
			}
		}
	}
	return n
}

// ref adds a reference to each of ss (a fork's child names its parent's
// slots); 0 entries are skipped.
func (p *slotPool) ref(ss ...Slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range ss {
		sl, pg := p.locLocked(s)
		if sl == nil || sl.refs[pg] == 0 {
			continue
		}
		p.extra++
		if sl.refs[pg] < slotRefMax {
			sl.refs[pg]++
			continue
		}
		if sl.over == nil {
			sl.over = map[int]uint32{}
		}
		sl.over[pg]++
	}
}

// release drops a reference to each of ss; a slot without references is
// free again. 0 entries are skipped.
func (p *slotPool) release(ss ...Slot) {
	freed := false
	p.mu.Lock()
	for _, s := range ss {
		i := int(s-1) / p.pps
		sl, pg := p.locLocked(s)
		if sl == nil || sl.refs[pg] == 0 {
			continue
		}
		if sl.refs[pg] == slotRefMax && sl.over[pg] > 0 {
			p.extra--
			if sl.over[pg]--; sl.over[pg] == 0 {
				delete(sl.over, pg)
			}
			continue
		}
		if sl.refs[pg]--; sl.refs[pg] > 0 {
			p.extra--
			continue
		}
		sl.used--
		sl.freed(pg)
		p.used--
		if i != p.drain {
			p.free++
		}
		if sl.used == 0 || p.short {
			freed = true
		}
	}
	wake := p.short && p.free > 0
	if wake {
		p.short = false
	}
	p.mu.Unlock()
	if freed {
		p.kickReservoir()
	}
	if wake {
		p.onRoom()
	}
}

func (p *slotPool) locLocked(s Slot) (*poolSlab, int) {
	if s == 0 {
		return nil, 0
	}
	i := int(s-1) / p.pps
	if i >= len(p.slabs) || p.slabs[i] == nil {
		return nil, 0
	}
	return p.slabs[i], int(s-1) % p.pps
}

func (p *slotPool) kickReservoir() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// layouter is a Store that tells how the memory servers keep a slab
// (pager/poolstore, pager/pagertest: their slabio.Table): copies of each
// used slot, or, erasure-coded, stripes of k slots and m parity pages.
type layouter interface {
	Layout(id remote.SlabID) (copies, k, m int)
}

// stats returns the pool's space.
func (p *slotPool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.slabs {
		if s != nil {
			n++
		}
	}
	stored := 0
	if l, ok := p.store.(layouter); ok {
		for _, s := range p.slabs {
			if s != nil {
				stored += s.stored(l.Layout(s.id))
			}
		}
	} else {
		stored = p.used
	}
	st := PoolStats{
		SlabSize: uint64(p.pps) * pageSize, Slabs: n,
		HeldBytes: uint64(n*p.pps) * pageSize, UsedBytes: uint64(p.used) * pageSize, StoredBytes: uint64(stored) * pageSize,
		Allocated: p.counts.allocated, Freed: p.counts.freed, Drained: p.counts.drained, Relocated: p.counts.relocated,
	}
	if p.noRoom != nil {
		st.NoRoom, st.NoRoomSince = p.noRoom.Error(), p.since
	}
	return st
}

// stored returns the page slots the servers hold for s's used slots:
// copies of each, or, erasure-coded, every page of each stripe (k
// consecutive slots and m parity pages) with a used slot: its freed slots
// are garbage the parity still covers until they are reused.
func (s *poolSlab) stored(copies, k, m int) int {
	if m == 0 || k < 1 {
		return s.used * copies
	}
	n := 0
	for i := 0; i < len(s.refs); i += k {
		if usedIn(s.refs[i:min(i+k, len(s.refs))]) > 0 {
			n += k + m
		}
	}
	return n
}

// full reports whether the pool said it has no room (ErrFull), rather
// than failing to answer.
func (p *slotPool) full() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.noRoom != nil && errors.Is(p.noRoom, remote.ErrFull)
}

// hasRoom reports whether the last Store.Alloc worked (or none failed).
func (p *slotPool) hasRoom() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.noRoom == nil || p.free > 0
}

// hasFree reports whether an alloc would get a slot now.
func (p *slotPool) hasFree() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.free > 0
}

// relocated counts pages a loop moved out of a draining slab.
func (p *slotPool) relocated(n int) {
	p.mu.Lock()
	p.counts.relocated += uint64(n)
	p.mu.Unlock()
}

// Reservoir timing.
const (
	reservoirTick  = time.Second
	noRoomBackoff  = 5 * time.Second // the longest wait between Store.Alloc tries without room
	drainGiveUp    = time.Minute     // a drain whose slab does not empty is abandoned
	storeCallLimit = 30 * time.Second
	idleAfter      = time.Second // without an alloc for this long, an empty pool keeps no slack
)

// RoutineReservoir keeps the pool's free slots between lowWater and about
// a slab's worth more: it allocates a slab when they run low, gives back
// empty slabs beyond that, and drains the emptiest slab when the space held
// passes 1.1x the space used plus a slab. A round runs when kicked or when
// its timer fires, at the time p.now says then; stepped (nil: none) is
// called after each. It runs until ctx ends.
func (p *slotPool) RoutineReservoir(ctx context.Context, stepped func()) {
	wait := reservoirTick
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-t.C:
		}
		wait = p.step(ctx, p.now(), wait)
		if stepped != nil {
			stepped()
		}
		t.Reset(wait)
	}
}

// step does one round of the reservoir at now and returns how long to
// wait for the next (backing off while the pool has no room).
func (p *slotPool) step(ctx context.Context, now time.Time, backoff time.Duration) time.Duration {
	copies := 0
	if p.trim.copies != nil {
		copies = p.trim.copies()
	}
	p.mu.Lock()
	need := p.free < p.low || p.short
	if need && !p.short && p.trimForRoomLocked(copies, now) {
		// Copies give the room back sooner than a slab would be right.
		p.mu.Unlock()
		p.onRoom()
		return trimSoon
	}
	p.mu.Unlock()
	if need {
		if !p.grow(ctx) {
			return min(max(2*backoff, 100*time.Millisecond), noRoomBackoff)
		}
		p.kickReservoir() // maybe another one is needed
		return reservoirTick
	}
	p.shrink(ctx, now)
	return reservoirTick
}

// grow adds a slab from the Store; it reports whether it got one.
func (p *slotPool) grow(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, storeCallLimit)
	ids, err := p.store.Alloc(cctx, 1)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		p.mu.Lock()
		first := p.noRoom == nil
		if first {
			p.since = p.now() // after the call, which may have taken a while
		}
		p.noRoom = err
		p.counts.allocErrs++
		p.mu.Unlock()
		if first {
			p.log.Warn("the pool gives no more memory: evictions of dirty pages wait, and so do faults past the budget (it holds); retrying",
				zap.Error(err))
		}
		return false
	}
	p.mu.Lock()
	i := 0
	for i < len(p.slabs) && p.slabs[i] != nil {
		i++
	}
	s := &poolSlab{id: ids[0], refs: make([]uint8, p.pps), stripe: p.stripeOf(ids[0])}
	if i == len(p.slabs) {
		p.slabs = append(p.slabs, s)
	} else {
		p.slabs[i] = s
	}
	if err := p.journal.slabEvent(opAdd, i, s.id); err != nil {
		p.log.Warn("recording a slab in the journal failed: a next agent would not find the pages in it", zap.Error(err))
	}
	p.free += p.pps
	p.counts.allocated++
	wasShort, hadNoRoom, since := p.short, p.noRoom != nil, p.since
	p.short, p.noRoom = false, nil
	p.publishLocked()
	p.mu.Unlock()
	if hadNoRoom {
		p.log.Info("the pool gives memory again", zap.Duration("after", p.now().Sub(since)))
	}
	if wasShort || hadNoRoom {
		p.onRoom()
	}
	return true
}

// shrink gives back empty slabs beyond the slack (free slots past
// lowWater plus one slab), and starts or ends a drain, at now.
func (p *slotPool) shrink(ctx context.Context, now time.Time) {
	var give []remote.SlabID
	copies := 0
	if p.trim.copies != nil {
		copies = p.trim.copies()
	}
	p.mu.Lock()
	trim := p.maybeTrimLocked(copies, now)
	if p.drain >= 0 {
		s := p.slabs[p.drain]
		switch {
		case s.used == 0:
			p.counts.drained++
			p.drain = -1
			p.free += p.pps // counted back, then freed below as an empty slab
		case now.Sub(p.drainAt) > drainGiveUp:
			p.log.Info("a slab did not empty in time (pages of a fork's copy, or busy); drain abandoned", zap.Int("used", s.used))
			p.free += p.pps - s.used
			p.drain = -1
		}
	}
	// With nothing in the pool and no slot asked for lately (no client,
	// or none paging out) no slack is kept: an idle agent holds no pool
	// memory.
	keep := p.low
	if p.used == 0 && now.Sub(p.asked) > idleAfter {
		keep = -p.pps
	}
	for i := len(p.slabs) - 1; i >= 0 && p.free-p.pps >= keep; i-- {
		if s := p.slabs[i]; s != nil && s.used == 0 && i != p.drain {
			give = append(give, s.id)
			p.slabs[i] = nil
			p.free -= p.pps
			p.journal.slabEvent(opFree, i, 0)
		}
	}
	for len(p.slabs) > 0 && p.slabs[len(p.slabs)-1] == nil {
		p.slabs = p.slabs[:len(p.slabs)-1]
	}
	drained := false
	if p.drain < 0 {
		drained = p.maybeDrainLocked(now)
	}
	p.publishLocked()
	if drained {
		// After the view names the slab: a loop that sees the new
		// generation sees what to drain.
		p.gen.Add(1)
	}
	p.mu.Unlock()
	if drained || trim {
		p.onRoom() // the loops, idle or not, move their pages out or trim
	}
	if len(give) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, storeCallLimit)
	defer cancel()
	if err := p.store.Free(cctx, give); err != nil {
		if ctx.Err() != nil {
			// Stopping: the lease's end gives them back.
			p.log.Debug("giving slabs back to the pool cut short by the agent's stop", zap.Int("slabs", len(give)))
		} else {
			p.log.Warn("giving slabs back to the pool failed", zap.Int("slabs", len(give)), zap.Error(err))
		}
	}
	p.mu.Lock()
	p.counts.freed += uint64(len(give))
	p.mu.Unlock()
}

// trimEvery spaces trims: copies come back as pages are faulted in, and
// each trim costs a write for every copy let go whose page is evicted.
const trimEvery = 5 * time.Second

// maybeTrimLocked asks the loops to let go of pool copies of clean
// resident pages when they are what puts the space held past 1.1x the
// remote pages plus a slab (and the slack); the drains then give the
// space back. It reports whether it asked (at now).
func (p *slotPool) maybeTrimLocked(copies int, now time.Time) bool {
	copies = p.freeableLocked(copies)
	held := 0
	for _, s := range p.slabs {
		if s != nil {
			held += p.pps
		}
	}
	remote := max(p.used-copies, 0)
	excess := held - (remote + remote/10 + p.pps + p.low)
	if excess <= 0 || copies == 0 || now.Sub(p.trim.last) < trimEvery {
		return false
	}
	p.trim.last = now
	p.trim.share.Store(uint32(min(1000, (min(excess, copies)*1000+copies-1)/copies)))
	p.trim.gen.Add(1)
	return true
}

// trimSoon spaces the trims that stand in for a new slab: the loops let go
// of the copies within a round or two of their loop.
const trimSoon = 50 * time.Millisecond

// trimFloor is the free slots a trim that stands in for a slab keeps: a
// few eviction batches, not the reservoir's low-water mark. Every copy let
// go is a page written again when it is evicted, and the copies let go are
// what the trims keep free: in 262,144 random reads of a 128 MiB heap
// (which just overflows two 64 MiB slabs) at 32 MiB local, keeping
// lowWater (1,024) free let go of 32k copies, 15% of the evictions; 3
// batches, 11k.
const trimFloor = 3 * maxEvictBatch

// trimForRoomLocked asks the loops to let go of pool copies of clean
// resident pages instead of taking a slab for free slots, when a slab more
// would put the space held past 1.1x the remote pages plus one slab (the
// copies are what fills it: a budget's worth of them over a slab of remote
// pages). It reports whether it asked or one asked lately is under way, or
// trimFloor slots are free (no slab then either); while evictions find no
// slot (short) the reservoir grows instead. now is the round's time.
func (p *slotPool) trimForRoomLocked(copies int, now time.Time) bool {
	copies, over := p.copiesOverBoundLocked(copies)
	if !over {
		return false
	}
	want := trimFloor - p.free
	if want <= 0 || now.Sub(p.trim.last) < trimSoon {
		return true
	}
	p.trim.last = now
	p.trim.share.Store(uint32(min(1000, (min(want, copies)*1000+copies-1)/copies)))
	p.trim.gen.Add(1)
	return true
}

// copiesOverBound reports whether the clients' pool copies of clean
// resident pages are what would put the space held past its bound if a
// slab were added (held > 1.1x the remote pages): an eviction short of
// slots then lets go of copies instead (slotsFor).
func (p *slotPool) copiesOverBound() bool {
	copies := 0
	if p.trim.copies != nil {
		copies = p.trim.copies()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, over := p.copiesOverBoundLocked(copies)
	return over
}

// copiesOverBoundLocked returns how many of copies (the clients' pool
// copies of clean resident pages) could be let go, and whether the space
// held is past 1.1x the remote pages, those copies left out.
func (p *slotPool) copiesOverBoundLocked(copies int) (int, bool) {
	copies = p.freeableLocked(copies)
	if copies == 0 {
		return 0, false
	}
	held := 0
	for _, s := range p.slabs {
		if s != nil {
			held += p.pps
		}
	}
	remote := max(p.used-copies, 0)
	return copies, held > remote+remote/10
}

// maybeDrainLocked starts draining the slab with the fewest used slots
// when the space held passes 1.1x the space used plus a slab (and the
// slack): the loops move their pages out of it, then it is given back.
// now is when it starts (drainGiveUp counts from it).
func (p *slotPool) maybeDrainLocked(now time.Time) bool {
	held := 0
	for _, s := range p.slabs {
		if s != nil {
			held += p.pps
		}
	}
	if held <= p.used+p.used/10+p.pps+p.low {
		return false
	}
	best := -1
	for i, s := range p.slabs {
		if s != nil && s.used > 0 && (best < 0 || s.used <= p.slabs[best].used) {
			best = i
		}
	}
	// The pages must fit elsewhere without a new slab.
	if best < 0 || p.free-(p.pps-p.slabs[best].used) < p.slabs[best].used+p.low {
		return false
	}
	p.drain, p.drainAt = best, now
	p.free -= p.pps - p.slabs[best].used
	p.log.Debug("draining a slab", zap.Int("slab", best), zap.Int("used", p.slabs[best].used), zap.Int("free", p.free))
	return true
}

// freeableLocked bounds how many slots letting go of the clients' copies
// would free: a slot shared by a fork's sides is counted as a copy by each
// side that has the page resident, and frees only when all of them let go,
// so each reference past a slot's first takes one off (exact for slots
// resident on every side, and never more than what would free).
func (p *slotPool) freeableLocked(copies int) int {
	return max(copies-p.extra, 0)
}

// sharing reports whether any slot is named by more than one page.
func (p *slotPool) sharing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.extra > 0
}

// shared reports whether slot s is named by more than one page (a fork's
// sides): letting go of one side's copy frees nothing.
func (p *slotPool) shared(s Slot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	sl, pg := p.locLocked(s)
	return sl != nil && sl.refs[pg] > 1
}

// restore puts back the slabs a previous agent left, by slab number, with
// no slot taken (claim takes the journaled ones).
func (p *slotPool) restore(nums map[int]remote.SlabID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for num, id := range nums {
		for len(p.slabs) <= num {
			p.slabs = append(p.slabs, nil)
		}
		p.slabs[num] = &poolSlab{id: id, refs: make([]uint8, p.pps), stripe: p.stripeOf(id)}
		p.free += p.pps
	}
	p.publishLocked()
}

// claim takes a reference to slot s for a client a previous agent served
// (free or not: a fork's sides share slots); false if its slab is gone.
func (p *slotPool) claim(s Slot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	sl, pg := p.locLocked(s)
	if sl == nil {
		return false
	}
	switch {
	case sl.refs[pg] == 0:
		sl.refs[pg] = 1
		sl.used++
		sl.took(pg)
		p.used++
		if int(s-1)/p.pps != p.drain {
			p.free--
		}
	case sl.refs[pg] < slotRefMax:
		sl.refs[pg]++
		p.extra++
	default:
		p.extra++
		if sl.over == nil {
			sl.over = map[int]uint32{}
		}
		sl.over[pg]++
	}
	return true
}

// freeSlabs gives slabs back to the Store (they were never the pool's).
func (p *slotPool) freeSlabs(ctx context.Context, ids []remote.SlabID) {
	cctx, cancel := context.WithTimeout(ctx, storeCallLimit)
	defer cancel()
	if err := p.store.Free(cctx, ids); err != nil {
		p.log.Warn("giving slabs back to the pool failed", zap.Int("slabs", len(ids)), zap.Error(err))
	}
}

// slabIDs returns the slabs the pool holds.
func (p *slotPool) slabIDs() []remote.SlabID {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []remote.SlabID
	for _, s := range p.slabs {
		if s != nil {
			ids = append(ids, s.id)
		}
	}
	return ids
}
