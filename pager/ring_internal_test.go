package pager

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// post is a thread's post of a fault at a in entry i of ring mem.
func post(mem []byte, i int, a userfaultfd.Addr, write bool) {
	off := proto.RingEntryOffset(i)
	flags := uint32(0)
	if write {
		flags = proto.RingWrite
	}
	proto.RingPut32(mem, off+proto.RingEntFlags, flags)
	binary.LittleEndian.PutUint64(mem[off+proto.RingEntAddr:], uint64(a))
	binary.LittleEndian.PutUint64(mem[off+proto.RingEntPosted:], uint64(proto.RingNow()))
	proto.RingStore(mem, off+proto.RingEntState, proto.RingPosted)
}

// The ring's states as the loop moves them: posted faults taken with their
// page and access, completed by the range installed (others left), the
// sleep that finds a post made before it, and a resuming agent taking
// back what its predecessor was serving.
func TestFaultRing(t *testing.T) {
	mem := make([]byte, proto.RingSize)
	var h Histogram
	var stall atomic.Int64
	r := newFaultRing(mem, false, &h)
	r.stall = &stall
	if proto.RingGet32(mem, proto.RingHdrMagic) != proto.RingMagic || proto.RingGet32(mem, proto.RingHdrEntries) != proto.RingEntries || r.pending() {
		t.Fatalf("a new ring: magic %#x, %d entries, pending %v", proto.RingGet32(mem, proto.RingHdrMagic), proto.RingGet32(mem, proto.RingHdrEntries), r.pending())
	}
	if r.sleep() || proto.RingLoad(mem, proto.RingHdrAgent) != proto.RingAsleep {
		t.Fatal("an empty ring: the loop does not sleep")
	}
	r.awake()
	post(mem, 3, 0x10001234, true)
	post(mem, 7, 0x20000008, false)
	if !r.pending() || !r.sleep() || proto.RingLoad(mem, proto.RingHdrAgent) != proto.RingAwake {
		t.Fatal("a post before the sleep: the loop must not block")
	}
	var got []ringServing
	r.take(func(i int, a userfaultfd.Addr, flags userfaultfd.FaultFlags) {
		if (i == 3) != (flags&userfaultfd.FaultWrite != 0) {
			t.Errorf("entry %d: flags %v", i, flags)
		}
		r.serve(i, a, i == 3) // 3 a miss, 7 a first touch
		got = append(got, ringServing{i, a, i == 3})
	})
	if len(got) != 2 || got[0] != (ringServing{3, 0x10001000, true}) || got[1] != (ringServing{7, 0x20000000, false}) || r.pending() {
		t.Fatalf("taken %v (pending %v), want entries 3 and 7 at their pages", got, r.pending())
	}
	r.complete(userfaultfd.Range{Start: 0x10000000, Len: 2 * pageSize}, proto.RingDone)
	if s3, s7 := proto.RingLoad(mem, proto.RingEntryOffset(3)), proto.RingLoad(mem, proto.RingEntryOffset(7)); s3 != proto.RingDone || s7 != proto.RingServing {
		t.Fatalf("after completing the first page: states %d, %d", s3, s7)
	}
	if h.Count() != 1 {
		t.Fatalf("%d waits observed, want 1", h.Count())
	}
	if got := time.Duration(stall.Load()); got < stallPerRingFault {
		t.Fatalf("stall %v after a miss's completion, want its wait plus %v", got, stallPerRingFault)
	}

	r2 := newFaultRing(mem, true, nil) // the agent died; the next takes the ring over
	if proto.RingLoad(mem, proto.RingEntryOffset(7)) != proto.RingPosted || proto.RingLoad(mem, proto.RingEntryOffset(3)) != proto.RingDone || !r2.pending() {
		t.Fatal("a resuming agent: the entry being served is not posted again, or a result was lost")
	}
}

// A first touch's wait is not stall; a miss's is, with the trap added.
func TestFaultRingStall(t *testing.T) {
	mem := make([]byte, proto.RingSize)
	var stall atomic.Int64
	r := newFaultRing(mem, false, nil)
	r.stall = &stall
	post(mem, 1, 0x7000, false)
	r.take(func(i int, a userfaultfd.Addr, _ userfaultfd.FaultFlags) { r.serve(i, a, false) })
	r.complete(userfaultfd.Range{Start: 0x7000, Len: pageSize}, proto.RingDone)
	if stall.Load() != 0 {
		t.Fatalf("stall %v after a first touch", time.Duration(stall.Load()))
	}
	post(mem, 2, 0x8000, false)
	r.take(func(i int, a userfaultfd.Addr, _ userfaultfd.FaultFlags) { r.serve(i, a, true) })
	r.completeEntry(2, proto.RingDone)
	if got := time.Duration(stall.Load()); got < stallPerRingFault {
		t.Fatalf("stall %v after a miss, want its wait plus %v", got, stallPerRingFault)
	}
}

// A thread sleeping on its entry is woken by the completion.
func TestFaultRingWakesSleeper(t *testing.T) {
	mem := make([]byte, proto.RingSize)
	r := newFaultRing(mem, false, nil)
	post(mem, 0, 0x5000, false)
	r.take(func(i int, a userfaultfd.Addr, _ userfaultfd.FaultFlags) { r.serve(i, a, true) })
	off := proto.RingEntryOffset(0)
	proto.RingStore(mem, off+proto.RingEntWaiters, 1)
	done := make(chan uint32)
	go func() {
		for {
			st := proto.RingLoad(mem, off+proto.RingEntState)
			if st != proto.RingServing {
				done <- st
				return
			}
			proto.RingWait(mem, off+proto.RingEntState, st, 10*time.Millisecond)
		}
	}()
	r.complete(userfaultfd.Range{Start: 0x5000, Len: pageSize}, proto.RingLost)
	select {
	case st := <-done:
		if st != proto.RingLost {
			t.Fatalf("woken with state %d, want RingLost", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sleeping thread was not woken")
	}
}
