package pager

import (
	"sync/atomic"
	"time"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// The fault ring, the agent's side (pager/proto/ring.go has the protocol):
// a client whose uffd raises SIGBUS (HelloRing) posts its faults in a
// page of its staging memfd, and its threads wait there, in user space,
// for the loop. The loop takes the posted entries as it reads uffd
// messages (serveRing), serves each as a fault, and completes an entry
// when what would have woken its thread in the kernel happens: an install,
// a wake, an unprotect of its page (gatedUFFD calls complete), or a
// poison (RingLost). docs/pager.md, Misses in the faulting thread.

// faultRing is a client's view of its ring: owned by the client's loop.
type faultRing struct {
	mem []byte // the ring's page of the staging mapping (proto.RingSize)
	// serving are the entries the loop took and has not completed, with
	// their pages: an install completes those of its range.
	serving []ringServing
	// Ring faults served and how long their threads waited, from their
	// post to the loop's completion (CLOCK_MONOTONIC, the thread's and the
	// loop's reading).
	faults *Histogram
	// stall, when set, adds up the waits of the faults that were misses
	// (not first touches), stallPerRingFault each added: the client's
	// stall (counters.stall) for its slowdown target.
	stall *atomic.Int64
}

// ringSpinFactor stretches the loop's spin (Options.Spin) for a ring
// client. The loop's next event is that client's next post, a whole miss
// later: its thread is served, runs, and faults again. Over tcp that cycle
// is longer than the default spin, so the loop ran out of it, slept, and
// the next post had to ring the doorbell and wait for its wake-up: random
// reads over tcp in ring mode (w3-2-inthread's rr, 128 MiB at 32 MiB)
// took 52-84 µs a miss with the loop's 50 µs spin, 39-48 µs with 200 µs,
// 53-64 µs with none; over shm 8.4-10.6 µs and 8.3-8.5 µs. Redis GETs
// over shm and tcp were the same either way (2026-12-06, one session).
// The spin still adapts, and ends after a few misses when posts stop.
const ringSpinFactor = 4

// loopSpin is the longest spin of a client's loop, max (--spin) stretched
// for a ring client.
func loopSpin(max time.Duration, ring bool) time.Duration {
	if ring {
		return ringSpinFactor * max // (a negative max, never spinning, stays so)
	}
	return max
}

// stallPerRingFault is what a miss through the ring costs its thread
// besides its wait in the ring: the trap into its SIGBUS handler and the
// install it makes itself (DESIGN.md: a miss served in the faulting
// thread, 5.2-6.0 µs in all).
const stallPerRingFault = 5 * time.Microsecond

type ringServing struct {
	entry int
	page  userfaultfd.Addr
	miss  bool // a miss, not a first touch: its wait is stall
}

// newFaultRing starts the ring in mem, a fresh one (its header written)
// or, with adopt, one a previous agent served: its entries taken and not
// completed are posted again (their threads still wait).
func newFaultRing(mem []byte, adopt bool, h *Histogram) *faultRing {
	r := &faultRing{mem: mem[:proto.RingSize], serving: make([]ringServing, 0, proto.RingEntries), faults: h}
	if !adopt {
		clear(r.mem)
		proto.RingPut32(r.mem, proto.RingHdrEntries, proto.RingEntries)
		proto.RingStore(r.mem, proto.RingHdrMagic, proto.RingMagic)
		return r
	}
	for i := range proto.RingEntries {
		proto.RingCAS(r.mem, proto.RingEntryOffset(i)+proto.RingEntState, proto.RingServing, proto.RingPosted)
	}
	proto.RingStore(r.mem, proto.RingHdrAgent, proto.RingAwake)
	return r
}

// pending reports whether an entry waits to be taken.
func (r *faultRing) pending() bool {
	for i := range proto.RingEntries {
		if proto.RingLoad(r.mem, proto.RingEntryOffset(i)+proto.RingEntState) == proto.RingPosted {
			return true
		}
	}
	return false
}

// ringWatch is how long the loop of a ring client, while it polls, watches
// the ring's post counter between two looks at its descriptors. A look is
// a sched_yield and a poll(2), 2-3 µs on these VMs (a system call costs
// ~1 µs), and a post that came during one waited for it to end, and for
// the scan after it; watching the counter, a word in shared memory, sees
// a post within a cache miss. Events on the descriptors (an EVICTED
// reply, a FORK) wait up to this much longer, while misses come.
const ringWatch = 3 * time.Microsecond

// watch spins up to d on the header's post counter, with no system call,
// and reports whether a thread posted meanwhile (the entries are then
// taken as ever: the counter only says when to look).
func (r *faultRing) watch(d time.Duration) bool {
	seen := proto.RingLoad64(r.mem, proto.RingHdrPosted)
	for start := proto.RingNow(); proto.RingNow()-start < d; {
		for range 32 {
			if proto.RingLoad64(r.mem, proto.RingHdrPosted) != seen {
				return true
			}
		}
	}
	return false
}

// sleep says the loop is about to block in poll(2): threads that post
// from now on ring the doorbell. It reports whether an entry was posted
// before they could see it (then the loop must not block).
func (r *faultRing) sleep() bool {
	proto.RingStore(r.mem, proto.RingHdrAgent, proto.RingAsleep) // sequentially consistent: then the entries are read
	if r.pending() {
		proto.RingStore(r.mem, proto.RingHdrAgent, proto.RingAwake)
		return true
	}
	return false
}

// awake says the loop looks at the ring again before it blocks.
func (r *faultRing) awake() { proto.RingStore(r.mem, proto.RingHdrAgent, proto.RingAwake) }

// take calls serve with each posted entry's page, access and flags, as
// the entry is taken (RingServing).
func (r *faultRing) take(serve func(entry int, page userfaultfd.Addr, flags userfaultfd.FaultFlags)) {
	for i := range proto.RingEntries {
		off := proto.RingEntryOffset(i)
		if !proto.RingCAS(r.mem, off+proto.RingEntState, proto.RingPosted, proto.RingServing) {
			continue
		}
		a := userfaultfd.Addr(proto.RingGet64(r.mem, off+proto.RingEntAddr))
		flags := userfaultfd.FaultFlags(0)
		if proto.RingGet32(r.mem, off+proto.RingEntFlags)&proto.RingWrite != 0 {
			flags |= userfaultfd.FaultWrite
		}
		serve(i, a.RoundDown(pageSize), flags)
	}
}

// serve records that the loop serves entry i's fault at page, a miss
// (its wait counts as stall) or a first touch.
func (r *faultRing) serve(i int, page userfaultfd.Addr, miss bool) {
	r.serving = append(r.serving, ringServing{i, page, miss})
}

// complete ends the faults being served on the pages of rg with state
// (RingDone, RingLost) and wakes their threads.
func (r *faultRing) complete(rg userfaultfd.Range, state uint32) {
	if len(r.serving) == 0 {
		return
	}
	end := rg.Start + userfaultfd.Addr(rg.Len)
	kept := r.serving[:0]
	for _, s := range r.serving {
		if s.page < rg.Start || s.page >= end {
			kept = append(kept, s)
			continue
		}
		r.finish(s, state)
	}
	r.serving = kept
}

// completeEntry ends entry i's fault with state, whatever its page.
func (r *faultRing) completeEntry(i int, state uint32) {
	for k, s := range r.serving {
		if s.entry == i {
			r.serving = append(r.serving[:k], r.serving[k+1:]...)
			r.finish(s, state)
			return
		}
	}
}

// finish stores the result of s's entry and wakes its thread if it
// sleeps, then counts its wait: the thread is on its way before the
// statistics (its post time is read first: once it sees the result, the
// thread frees the entry, and another may take it).
func (r *faultRing) finish(s ringServing, state uint32) {
	off := proto.RingEntryOffset(s.entry)
	posted := time.Duration(proto.RingGet64(r.mem, off+proto.RingEntPosted))
	proto.RingStore(r.mem, off+proto.RingEntState, state)
	if proto.RingLoad(r.mem, off+proto.RingEntWaiters) != 0 {
		proto.RingWake(r.mem, off+proto.RingEntState)
	}
	if now := proto.RingNow(); posted > 0 && now > posted {
		if r.faults != nil {
			r.faults.Observe(now - posted)
		}
		if r.stall != nil && s.miss {
			r.stall.Add(int64(now - posted + stallPerRingFault))
		}
	}
}
