package proto

import (
	"encoding/binary"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The fault ring's words in shared memory, for both of its sides in Go
// (the agent's loop and pagertest's fake process): the state and agent
// words are read and written atomically (the process's threads do the
// same in C), the other fields are plain little-endian words written
// before the entry's state is published. mem is the ring's page, off a
// word's offset in it (RingHdr*, RingEntryOffset + RingEnt*).

func ringWord(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

// RingLoad, RingStore and RingCAS read, write and compare-and-swap the
// 32-bit word at off atomically.
func RingLoad(mem []byte, off int) uint32     { return atomic.LoadUint32(ringWord(mem, off)) }
func RingStore(mem []byte, off int, v uint32) { atomic.StoreUint32(ringWord(mem, off), v) }
func RingCAS(mem []byte, off int, old, new uint32) bool {
	return atomic.CompareAndSwapUint32(ringWord(mem, off), old, new)
}

// RingLoad64 and RingAdd64 read and add to the 64-bit counter at off
// (RingHdrPosted, RingHdrDoorbells) atomically.
func RingLoad64(mem []byte, off int) uint64   { return atomic.LoadUint64(ringWord64(mem, off)) }
func RingAdd64(mem []byte, off int, d uint64) { atomic.AddUint64(ringWord64(mem, off), d) }

func ringWord64(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }

// RingGet32, RingGet64, RingPut32 and RingPut64 read and write the plain
// little-endian words.
func RingGet32(mem []byte, off int) uint32    { return binary.LittleEndian.Uint32(mem[off:]) }
func RingGet64(mem []byte, off int) uint64    { return binary.LittleEndian.Uint64(mem[off:]) }
func RingPut32(mem []byte, off int, v uint32) { binary.LittleEndian.PutUint32(mem[off:], v) }
func RingPut64(mem []byte, off int, v uint64) { binary.LittleEndian.PutUint64(mem[off:], v) }

// futexWait and futexWake are FUTEX_WAIT and FUTEX_WAKE (linux/futex.h)
// without FUTEX_PRIVATE_FLAG: the ring is shared between processes.
const (
	futexWait = 0
	futexWake = 1
)

// RingWake wakes every thread sleeping on the word at off.
func RingWake(mem []byte, off int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&mem[off])), futexWake, math.MaxInt32, 0, 0, 0)
}

// RingWait sleeps while the word at off holds v, for at most d.
func RingWait(mem []byte, off int, v uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&mem[off])), futexWait, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// RingNow is CLOCK_MONOTONIC, the clock the process's threads stamp
// their posts with (RingEntPosted), read as the runtime reads it: through
// the vDSO. unix.ClockGettime is a system call, about 1 µs on these VMs,
// and the loop reads the clock once per ring fault it completes.
func RingNow() time.Duration { return time.Duration(nanotime()) }

// nanotime is the runtime's CLOCK_MONOTONIC (vDSO) reading.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64
