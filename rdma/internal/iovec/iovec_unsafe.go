package iovec

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The sockets are non-blocking (Go's netpoller waits for readiness), so
// readv and writev never block: RawSyscall skips the scheduler hand-off of
// Syscall, which is measurable on a 4 KiB round trip. A 1 MiB copy keeps
// the P for its duration (tens of microseconds).

// readv is readv(2) without the allocation of unix.Readv.
func readv(fd int, iov []unix.Iovec) (int, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// writev is writev(2) without the allocation of unix.Writev.
func writev(fd int, iov []unix.Iovec) (int, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}
