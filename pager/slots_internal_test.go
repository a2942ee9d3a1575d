package pager

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"rmem/pager/remote"
)

// fakeStore is a Store of slab ids only (the slot pool never moves data).
type fakeStore struct {
	mu       sync.Mutex
	slabSize uint64
	capacity int // slabs it gives at most
	held     map[remote.SlabID]bool
	next     remote.SlabID
}

var errFull = errors.New("fake store: full")

func (s *fakeStore) SlabSize() uint64 { return s.slabSize }
func (s *fakeStore) Alloc(_ context.Context, n int) ([]remote.SlabID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held)+n > s.capacity {
		return nil, errFull
	}
	var ids []remote.SlabID
	for range n {
		s.next++
		s.held[s.next] = true
		ids = append(ids, s.next)
	}
	return ids, nil
}
func (s *fakeStore) Free(_ context.Context, ids []remote.SlabID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.held, id)
	}
	return nil
}
func (s *fakeStore) OpenIO() (remote.PageIO, error) { return nil, errors.New("fake store: no I/O") }
func (s *fakeStore) nheld() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// testClock is a clock a test moves on.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newTestPool returns a pool of slabs of pps pages over a store of
// capacity slabs, its decisions on a clock that moves only when the test
// moves it.
func newTestPool(t *testing.T, pps, capacity int) (*slotPool, *fakeStore, *testClock) {
	st := &fakeStore{slabSize: uint64(pps) * pageSize, capacity: capacity, held: map[remote.SlabID]bool{}}
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	return newSlotPool(st, zaptest.NewLogger(t), clk.now), st, clk
}

// take allocates n slots, running the reservoir when it comes back short,
// as the loops and RoutineReservoir do together.
func take(t *testing.T, p *slotPool, n int) []Slot {
	t.Helper()
	out := make([]Slot, n)
	got := 0
	for tries := 0; got < n; tries++ {
		got += p.alloc(out[got:])
		if got < n {
			if tries > 100 {
				t.Fatalf("only %d of %d slots", got, n)
			}
			p.step(context.Background(), p.now(), reservoirTick)
		}
	}
	return out
}

func TestSlotPoolRefs(t *testing.T) {
	p, st, clk := newTestPool(t, 512, 8)
	if n := p.alloc(make([]Slot, 4)); n != 0 {
		t.Fatalf("an empty pool gave %d slots", n)
	}
	ss := take(t, p, 600) // more than a slab
	seen := map[Slot]bool{}
	for _, s := range ss {
		if s == 0 || seen[s] {
			t.Fatalf("slot %d given twice or zero", s)
		}
		seen[s] = true
		if id, off := p.where(s); id == 0 || off%pageSize != 0 || off >= st.slabSize {
			t.Fatalf("slot %d is at slab %d offset %d", s, id, off)
		}
	}
	// Consecutive slots for a batch: one READ when they come back.
	for i := 1; i < 100; i++ {
		id0, off0 := p.where(ss[i-1])
		id1, off1 := p.where(ss[i])
		if id0 != id1 || off1 != off0+pageSize {
			t.Fatalf("slots %d and %d of one batch are not adjacent: %d/%d, %d/%d", i-1, i, id0, off0, id1, off1)
		}
	}
	// A shared slot (a fork) survives the first release.
	for range slotRefMax + 10 {
		p.ref(ss[0])
	}
	for range slotRefMax + 10 {
		p.release(ss[0])
	}
	if st := p.stats(); st.UsedBytes != 600*pageSize {
		t.Fatalf("used %d after shared releases, want 600 pages", st.UsedBytes)
	}
	p.release(ss...)
	if st := p.stats(); st.UsedBytes != 0 {
		t.Fatalf("used %d after releasing everything", st.UsedBytes)
	}
	p.step(context.Background(), p.now(), reservoirTick)
	if n := st.nheld(); n == 0 {
		t.Fatalf("no slack kept right after allocations")
	}
	clk.advance(idleAfter)
	p.step(context.Background(), p.now(), reservoirTick)
	if n := st.nheld(); n == 0 {
		t.Fatalf("no slack kept %v after the last allocation", idleAfter)
	}
	clk.advance(time.Nanosecond) // idle for longer than idleAfter
	p.step(context.Background(), p.now(), reservoirTick)
	if n := st.nheld(); n != 0 || p.stats().Slabs != 0 {
		t.Fatalf("%d slabs held with nothing used: an idle agent holds no pool memory", n)
	}
	p.release(ss[0]) // a stale release is harmless
}

// The space held follows the space used: at most 1.1x plus one slab, as
// pages are paged out, and back down as they are freed. (With slabs of
// under ~12 eviction batches, 1536 pages, the reservoir's floor of two
// batches of free slots comes first.)
func TestSlotPoolFollowsData(t *testing.T) {
	const pps = 4096
	p, st, _ := newTestPool(t, pps, 64)
	var all []Slot
	check := func(when string) {
		t.Helper()
		s := p.stats()
		if float64(s.HeldBytes) > 1.1*float64(s.UsedBytes)+float64(pps*pageSize) {
			t.Fatalf("%s: held %d for %d used: more than 1.1x plus a slab", when, s.HeldBytes, s.UsedBytes)
		}
	}
	for len(all) < 20*pps {
		all = append(all, take(t, p, 128)...)
		p.step(context.Background(), p.now(), reservoirTick)
		check("growing")
	}
	// Free the newest half: whole slabs empty and go back.
	p.release(all[len(all)/2:]...)
	all = all[:len(all)/2]
	p.step(context.Background(), p.now(), reservoirTick)
	check("after freeing the newest half")
	if st.nheld() > 12 {
		t.Fatalf("%d slabs held for 10 slabs' worth of pages", st.nheld())
	}
	// Free every other page: no slab empties by itself; a drain starts.
	var kept []Slot
	for i, s := range all {
		if i%2 == 0 {
			p.release(s)
		} else {
			kept = append(kept, s)
		}
	}
	gen := p.gen.Load()
	p.step(context.Background(), p.now(), reservoirTick)
	if p.gen.Load() == gen {
		t.Fatalf("no drain with %+v", p.stats())
	}
	d := p.view.Load().drain
	var moved []Slot
	for i, s := range kept {
		if p.draining(s) {
			// A loop moves the page: a new slot, then the old one goes.
			n := take(t, p, 1)
			if p.draining(n[0]) {
				t.Fatalf("a new slot in the slab being drained")
			}
			moved = append(moved, n[0])
			p.release(s)
			kept[i] = 0
		}
	}
	p.step(context.Background(), p.now(), reservoirTick)
	if p.stats().Drained != 1 || p.view.Load().drain == d {
		t.Fatalf("the drained slab was not given back: %+v", p.stats())
	}
	for range 20 { // drain after drain, as the loops move their pages
		p.step(context.Background(), p.now(), reservoirTick)
		for i, s := range kept {
			if s != 0 && p.draining(s) {
				kept[i] = take(t, p, 1)[0]
				p.release(s)
			}
		}
	}
	p.step(context.Background(), p.now(), reservoirTick)
	check("after drains")
	_ = moved
}

// A full pool: allocs come back short, the reservoir says why (once), and
// the loops are woken when a slab comes again.
func TestSlotPoolNoRoom(t *testing.T) {
	p, st, _ := newTestPool(t, 256, 1)
	woken := 0
	p.onRoom = func() { woken++ }
	ss := take(t, p, 256)
	woken = 0
	if n := p.alloc(make([]Slot, 8)); n != 0 {
		t.Fatalf("a full pool gave %d slots", n)
	}
	p.step(context.Background(), p.now(), reservoirTick)
	s := p.stats()
	if s.NoRoom == "" || s.NoRoomSince.IsZero() {
		t.Fatalf("a pool without room says nothing: %+v", s)
	}
	// Room comes back from the program's own frees first...
	p.release(ss[:10]...)
	if woken != 1 {
		t.Fatalf("freed slots after a short alloc woke the loops %d times, want 1", woken)
	}
	if n := p.alloc(make([]Slot, 20)); n != 10 {
		t.Fatalf("got %d of the 10 freed slots", n)
	}
	// ... and from the store.
	st.mu.Lock()
	st.capacity = 2
	st.mu.Unlock()
	p.step(context.Background(), p.now(), reservoirTick)
	if woken != 2 || p.stats().NoRoom != "" {
		t.Fatalf("room from the store: woken %d, stats %+v", woken, p.stats())
	}
}

// When pool copies of clean resident pages are what puts the space held
// past 1.1x the remote pages plus a slab, the loops are asked to let go
// of the share that is too much (then the drains give the space back);
// not more often than trimEvery.
func TestSlotPoolTrim(t *testing.T) {
	const pps = 4096
	p, _, clk := newTestPool(t, pps, 64)
	copies := 0
	p.trim.copies = func() int { return copies }
	take(t, p, 6*pps) // 6 slabs' worth used
	p.step(context.Background(), p.now(), reservoirTick)
	if p.trim.gen.Load() != 0 {
		t.Fatalf("a trim with no copies")
	}
	copies = 3 * pps // half of it only copies: remote is 3 slabs, held 7
	p.step(context.Background(), p.now(), reservoirTick)
	if p.trim.gen.Load() != 1 {
		t.Fatalf("no trim with held %d slabs for %d pages remote", p.stats().Slabs, 6*pps-copies)
	}
	// 7 slabs held, 3 remote: 7 - (3.3 + 1 + low) ≈ 2.6 slabs too much, of 3 in copies.
	if s := p.trim.share.Load(); s < 800 || s > 900 {
		t.Errorf("trim share %d per mille, want about 870", s)
	}
	p.step(context.Background(), p.now(), reservoirTick)
	if p.trim.gen.Load() != 1 {
		t.Errorf("a second trim within %v", trimEvery)
	}
	clk.advance(trimEvery) // the copies were not let go: ask again
	p.step(context.Background(), p.now(), reservoirTick)
	if p.trim.gen.Load() != 2 {
		t.Errorf("no second trim %v after the first", trimEvery)
	}
}

// When free slots run low and the pool copies of clean resident pages are
// what fills the slabs (a budget's worth of copies over a slab of remote
// pages), the reservoir asks for copies back rather than a slab that would
// put the space held past 1.1x the remote pages plus one slab; once
// evictions find no slot at all it takes the slab.
func TestSlotPoolTrimBeforeGrow(t *testing.T) {
	const pps = 4096
	p, _, _ := newTestPool(t, pps, 8)
	copies := 0
	p.trim.copies = func() int { return copies }
	take(t, p, pps-p.low/2) // one slab, nearly full
	copies = pps / 4        // a quarter of it copies: 0.75 slab remote
	p.step(context.Background(), p.now(), reservoirTick)
	if n := p.stats().Slabs; n != 1 || p.trim.gen.Load() != 1 {
		t.Fatalf("%d slabs, %d trims: want the copies asked for, no slab", n, p.trim.gen.Load())
	}
	if s := p.trim.share.Load(); s == 0 || s > 1000 {
		t.Errorf("trim share %d per mille", s)
	}
	p.step(context.Background(), p.now(), reservoirTick)
	if p.trim.gen.Load() != 1 || p.stats().Slabs != 1 {
		t.Errorf("a trim under way: %d trims, %d slabs; want it waited for", p.trim.gen.Load(), p.stats().Slabs)
	}
	copies = 0 // nothing to let go: a slab is right
	p.step(context.Background(), p.now(), reservoirTick)
	if n := p.stats().Slabs; n != 2 {
		t.Errorf("%d slabs with no copies to let go, want 2", n)
	}
	// Remote pages alone fill a slab: the next slab keeps the rule.
	p2, _, _ := newTestPool(t, pps, 8)
	p2.trim.copies = func() int { return 16 }
	take(t, p2, pps-p2.low/2)
	p2.step(context.Background(), p2.now(), reservoirTick)
	if n := p2.stats().Slabs; n != 2 || p2.trim.gen.Load() != 0 {
		t.Errorf("remote pages near a slab: %d slabs, %d trims; want a second slab", n, p2.trim.gen.Load())
	}
	// Evictions short of slots: the slab, copies or not.
	p3, _, _ := newTestPool(t, pps, 8)
	p3.trim.copies = func() int { return pps / 4 }
	ss := take(t, p3, pps)
	if n := p3.alloc(ss[:1]); n != 0 {
		t.Fatalf("a full slab gave a slot")
	}
	p3.mu.Lock()
	p3.short = true
	p3.mu.Unlock()
	p3.step(context.Background(), p3.now(), reservoirTick)
	if n := p3.stats().Slabs; n != 2 {
		t.Errorf("short of slots: %d slabs, want 2", n)
	}
}

// Slots a fork's sides share free only when every side lets go of its
// copy: the copies the clients count (each side with the page resident
// counts one) are worth a slot each only past the references a fork added,
// and no trim is asked for when the shared copies are all there is (before
// this, a forked child reading its heap made the reservoir trim instead of
// growing: evictions waited for slots that the trim never freed).
func TestSlotPoolSharedCopiesFreeNothing(t *testing.T) {
	const pps = 4096
	p, _, _ := newTestPool(t, pps, 8)
	ss := take(t, p, pps-p.low/2) // one slab, nearly full
	p.ref(ss...)                  // a fork: the child names every slot
	p.mu.Lock()
	extra, free := p.extra, p.freeableLocked(2*len(ss))
	p.mu.Unlock()
	if extra != len(ss) || free != len(ss) {
		t.Fatalf("after the fork %d extra references, %d slots freeable with both sides' copies; want %d and %d", extra, free, len(ss), len(ss))
	}
	if !p.shared(ss[0]) {
		t.Errorf("slot %d named by both sides reads as not shared", ss[0])
	}
	// The child has its whole heap resident, the parent none of it:
	// the child's copies free nothing, so the reservoir takes a slab.
	p.trim.copies = func() int { return len(ss) }
	p.step(context.Background(), p.now(), reservoirTick)
	if n := p.stats().Slabs; n != 2 || p.trim.gen.Load() != 0 {
		t.Errorf("shared copies only: %d slabs, %d trims; want a second slab, no trim", n, p.trim.gen.Load())
	}
	p.release(ss...) // the child exits
	p.mu.Lock()
	extra = p.extra
	p.mu.Unlock()
	if extra != 0 || p.shared(ss[0]) {
		t.Errorf("after the child's release: %d extra references, shared %v", extra, p.shared(ss[0]))
	}
	if got := p.stats().UsedBytes; got != uint64(len(ss))*pageSize {
		t.Errorf("used %d bytes, want the parent's %d slots", got, len(ss))
	}
}

// ecStore is a fakeStore whose slabs are erasure-coded, k slots a stripe.
type ecStore struct {
	*fakeStore
	k int
}

func (s ecStore) Layout(remote.SlabID) (copies, k, m int) { return 1, s.k, 2 }

// Under erasure coding whole free stripes are taken before slots freed
// here and there, so that a write-back batch covers its stripes (no read
// for their parity); once the free slots of used stripes (garbage) pass a
// tenth of the used slots, they are taken first, so that what the servers
// hold stays within about 1.1x (k+m)/k of the pages.
func TestSlotPoolStripes(t *testing.T) {
	st := ecStore{&fakeStore{slabSize: 64 * pageSize, capacity: 4, held: map[remote.SlabID]bool{}}, 4}
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	p := newSlotPool(st, zaptest.NewLogger(t), clk.now)
	all := take(t, p, 48) // stripes 0-11
	stripeOf := func(s Slot) int { return int(s-1) % 64 / 4 }
	garbage := func() int { return p.slabs[0].garbage }
	// One slot of stripe 0 freed (garbage 1 of 47 used), and all of
	// stripe 5 (free again, not garbage).
	p.release(all[1])
	p.release(all[20:24]...)
	if g := garbage(); g != 1 {
		t.Fatalf("garbage %d, want 1", g)
	}
	got := take(t, p, 8)
	for _, s := range got {
		if stripeOf(s) == 0 {
			t.Fatalf("took slot %d of stripe 0, partly used, while whole stripes were free: %v", s, got)
		}
	}
	// Four more slots freed in stripes 1-4: garbage 5 of 47 used, past a
	// tenth: the next slots come from the used stripes.
	p.release(all[5], all[9], all[13], all[17])
	if g, used := garbage(), p.stats().UsedBytes/pageSize; g != 5 || used != 47 {
		t.Fatalf("garbage %d used %d, want 5 and 47", g, used)
	}
	for _, s := range take(t, p, 5) {
		if n := stripeOf(s); n > 4 {
			t.Fatalf("took slot %d of stripe %d while the garbage was high", s, n)
		}
	}
	if g := garbage(); g != 0 {
		t.Fatalf("garbage %d after the used stripes' free slots were taken", g)
	}
	// What the servers hold: every stripe with a used slot, k + m pages
	// (13 of 16 stripes: 52 slots used).
	if c := p.slabs[0].stored(1, 4, 2); c != 13*6 {
		t.Fatalf("13 stripes in use store %d slots, want 13 x 6", c)
	}
	p.release(all[40])
	if c := p.slabs[0].stored(1, 4, 2); c != 13*6 {
		t.Fatalf("a freed slot is garbage its stripe still holds: %d slots, want 13 x 6", c)
	}
}
