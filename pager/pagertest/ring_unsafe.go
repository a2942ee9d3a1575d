package pagertest

import (
	"encoding/binary"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func word32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

func loadU32(mem []byte, off int) uint32     { return atomic.LoadUint32(word32(mem, off)) }
func storeU32(mem []byte, off int, v uint32) { atomic.StoreUint32(word32(mem, off), v) }
func casU32(mem []byte, off int, old, new uint32) bool {
	return atomic.CompareAndSwapUint32(word32(mem, off), old, new)
}
func putU32(mem []byte, off int, v uint32) { binary.LittleEndian.PutUint32(mem[off:], v) }
func putU64(mem []byte, off int, v uint64) { binary.LittleEndian.PutUint64(mem[off:], v) }

// futexWaitOp is FUTEX_WAIT (linux/futex.h), without FUTEX_PRIVATE_FLAG:
// the word is in memory shared with the agent.
const futexWaitOp = 0

// futexWait sleeps while the word at off holds v, for at most d.
func futexWait(mem []byte, off int, v uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&mem[off])), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func monotonic() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}
