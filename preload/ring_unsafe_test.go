package preload

import (
	"math"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

const futexWake = 1 // FUTEX_WAKE, shared (no FUTEX_PRIVATE_FLAG): the ring is the client's too

// agentRing is the test agent's view of a client's fault ring
// (pager/proto/ring.go): RingSize bytes of the staging mapping, after the
// slots. Every word the client shares is read and written atomically.
type agentRing struct{ mem []byte }

// ringFault is an entry the agent took (POSTED -> SERVING).
type ringFault struct {
	idx   int
	addr  userfaultfd.Addr
	write bool
	tid   uint32
}

func (r agentRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }
func (r agentRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }

func (r agentRing) state(i int) *uint32 {
	return r.u32(proto.RingEntryOffset(i) + proto.RingEntState)
}

// init writes the header, before WELCOME.
func (r agentRing) init() {
	atomic.StoreUint32(r.u32(proto.RingHdrEntries), proto.RingEntries)
	atomic.StoreUint32(r.u32(proto.RingHdrAgent), proto.RingAwake)
	atomic.StoreUint32(r.u32(proto.RingHdrMagic), proto.RingMagic)
}

// setAgent stores the agent word (RingAwake, RingAsleep).
func (r agentRing) setAgent(v uint32) { atomic.StoreUint32(r.u32(proto.RingHdrAgent), v) }

// take claims every posted entry for serving and returns them.
func (r agentRing) take(out []ringFault) []ringFault {
	for i := range proto.RingEntries {
		st := r.state(i)
		if atomic.LoadUint32(st) != proto.RingPosted || !atomic.CompareAndSwapUint32(st, proto.RingPosted, proto.RingServing) {
			continue
		}
		base := proto.RingEntryOffset(i)
		out = append(out, ringFault{
			idx:   i,
			addr:  userfaultfd.Addr(atomic.LoadUint64(r.u64(base + proto.RingEntAddr))),
			write: atomic.LoadUint32(r.u32(base+proto.RingEntFlags))&proto.RingWrite != 0,
			tid:   atomic.LoadUint32(r.u32(base + proto.RingEntTID)),
		})
	}
	return out
}

// complete stores entry i's result and wakes the thread waiting on it.
func (r agentRing) complete(i int, result uint32) {
	st := r.state(i)
	atomic.StoreUint32(st, result)
	if atomic.LoadUint32(r.u32(proto.RingEntryOffset(i)+proto.RingEntWaiters)) != 0 {
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(st)), futexWake, math.MaxInt32, 0, 0, 0)
	}
}

// requeue takes back entries a previous agent was serving (a resume).
func (r agentRing) requeue() int {
	n := 0
	for i := range proto.RingEntries {
		if atomic.CompareAndSwapUint32(r.state(i), proto.RingServing, proto.RingPosted) {
			n++
		}
	}
	return n
}

// counts are the header's counters: faults posted, doorbells rung.
func (r agentRing) counts() (posted, doorbells uint64) {
	return atomic.LoadUint64(r.u64(proto.RingHdrPosted)), atomic.LoadUint64(r.u64(proto.RingHdrDoorbells))
}
