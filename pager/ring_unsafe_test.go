package pager

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futexWaitForTest sleeps while the word at off holds v (at most 10 ms a
// call; the tests loop).
func futexWaitForTest(mem []byte, off int, v uint32) {
	ts := unix.NsecToTimespec(int64(10 * time.Millisecond))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&mem[off])), 0, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}
