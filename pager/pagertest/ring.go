package pagertest

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// ErrNotMine is what a thread's access returns when the agent answers its
// ring fault RingNotMine: the SIGBUS would go to the program's handler.
var ErrNotMine = errors.New("pagertest: SIGBUS not the pager's")

// ringClient is the fault ring as the shim's SIGBUS handler uses it, for a
// Kernel in SIGBUS mode (UseRing): a faulting thread posts its fault in
// shared memory, rings the doorbell if the agent sleeps, and waits on the
// entry's futex word (pager/proto/ring.go).
type ringClient struct {
	mem      []byte
	doorbell int
}

// UseRing puts k in SIGBUS mode, as a uffd made with UFFD_FEATURE_SIGBUS:
// a thread's fault is posted in the fault ring mem (the page of the
// staging memfd after its slots) instead of queued as a message, and the
// thread waits there; doorbell (owned from now on) is the eventfd it
// rings when the ring says the agent sleeps.
func (k *Kernel) UseRing(mem []byte, doorbell int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ring = &ringClient{mem: mem[:proto.RingSize], doorbell: doorbell}
}

// ringFault posts a fault at page pg (a write if write) and waits for the
// agent's answer until deadline (k.mu not held).
func (r *ringClient) fault(pg userfaultfd.Addr, write bool, deadline time.Time) (uint32, error) {
	entry := -1
	for entry < 0 {
		for i := range proto.RingEntries {
			if proto.RingCAS(r.mem, proto.RingEntryOffset(i)+proto.RingEntState, proto.RingFree, proto.RingClaimed) {
				entry = i
				break
			}
		}
		if entry < 0 {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%w: no free ring entry", ErrNotServed)
			}
			time.Sleep(time.Millisecond) // every entry is taken: a thread's wait, as the shim's
		}
	}
	off := proto.RingEntryOffset(entry)
	flags := uint32(0)
	if write {
		flags = proto.RingWrite
	}
	proto.RingPut32(r.mem, off+proto.RingEntFlags, flags)
	proto.RingPut32(r.mem, off+proto.RingEntTID, uint32(unix.Gettid()))
	proto.RingPut64(r.mem, off+proto.RingEntAddr, uint64(pg))
	proto.RingPut64(r.mem, off+proto.RingEntPosted, uint64(proto.RingNow()))
	proto.RingStore(r.mem, off+proto.RingEntState, proto.RingPosted)
	proto.RingAdd64(r.mem, proto.RingHdrPosted, 1)
	if proto.RingLoad(r.mem, proto.RingHdrAgent) == proto.RingAsleep {
		var one [8]byte
		one[0] = 1
		unix.Write(r.doorbell, one[:])
	}
	for {
		st := proto.RingLoad(r.mem, off+proto.RingEntState)
		if st != proto.RingPosted && st != proto.RingServing {
			proto.RingStore(r.mem, off+proto.RingEntState, proto.RingFree)
			return st, nil
		}
		if time.Now().After(deadline) {
			return 0, ErrNotServed // the entry stays: the thread is gone as far as the agent can tell
		}
		proto.RingStore(r.mem, off+proto.RingEntWaiters, 1)
		proto.RingWait(r.mem, off+proto.RingEntState, st, 10*time.Millisecond)
		proto.RingStore(r.mem, off+proto.RingEntWaiters, 0)
	}
}

func (r *ringClient) close() { unix.Close(r.doorbell) }

// RingAsleep reports whether the agent said, in k's fault ring, that it
// sleeps (a post must ring the doorbell).
func (k *Kernel) RingAsleep() bool {
	k.mu.Lock()
	r := k.ring
	k.mu.Unlock()
	return r != nil && proto.RingLoad(r.mem, proto.RingHdrAgent) == proto.RingAsleep
}
