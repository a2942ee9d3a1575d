package iovec

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// readv is readv(2) without the allocation of unix.Readv.
func readv(fd int, iov []unix.Iovec) (int, error) {
	n, _, errno := unix.Syscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// writev is writev(2) without the allocation of unix.Writev.
func writev(fd int, iov []unix.Iovec) (int, error) {
	n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}
