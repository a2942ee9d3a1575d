package traced

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// word returns the 32-bit word at off of a mapped page, for atomics and
// futexes shared with the parasite.
func word(b []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&b[off])) }

// Futex operations, shared (not FUTEX_PRIVATE_FLAG): the parasite's
// words lie in a MAP_SHARED memfd page.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWake wakes the sleepers on w (a shared futex: the word lies in a
// MAP_SHARED mapping the program maps too).
func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, 1, 0, 0, 0)
}

// futexWait sleeps while *w == v, for at most timeout.
func futexWait(w *atomic.Uint32, v uint32, timeout *unix.Timespec) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(timeout)), 0, 0)
}

// addrOf is the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// inGroupStop reports whether tid's stop is a group-stop (PTRACE_GETSIGINFO
// fails with EINVAL there) rather than a signal's delivery.
func inGroupStop(tid int) bool {
	var si [128]byte
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_GETSIGINFO, uintptr(tid), 0, uintptr(unsafe.Pointer(&si[0])), 0, 0)
	return e == unix.EINVAL
}
