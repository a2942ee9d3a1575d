package pager

import (
	"encoding/binary"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The fault ring's words in shared memory (ring.go): the state and agent
// words are read and written atomically (the process's threads do the
// same in C), the other fields are plain little-endian words written
// before the entry's state is published.

func word32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

func loadU32(mem []byte, off int) uint32     { return atomic.LoadUint32(word32(mem, off)) }
func storeU32(mem []byte, off int, v uint32) { atomic.StoreUint32(word32(mem, off), v) }
func casU32(mem []byte, off int, old, new uint32) bool {
	return atomic.CompareAndSwapUint32(word32(mem, off), old, new)
}

func getU32(mem []byte, off int) uint32    { return binary.LittleEndian.Uint32(mem[off:]) }
func getU64(mem []byte, off int) uint64    { return binary.LittleEndian.Uint64(mem[off:]) }
func putU32(mem []byte, off int, v uint32) { binary.LittleEndian.PutUint32(mem[off:], v) }

// futexWakeOp is FUTEX_WAKE (linux/futex.h), without FUTEX_PRIVATE_FLAG.
const futexWakeOp = 1

// futexWake wakes every thread sleeping in FUTEX_WAIT on the word at off
// (a shared futex: the mapping is shared with the process).
func futexWake(mem []byte, off int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&mem[off])), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// monotonic is CLOCK_MONOTONIC, the clock the process's threads stamp
// their posts with.
func monotonic() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}
