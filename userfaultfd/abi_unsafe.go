package userfaultfd

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl calls ioctl(fd, req, arg) and returns the kernel's return value.
// arg must point to memory that stays valid for the call (a local or a
// field of a live object); nothing escapes.
func ioctl(fd int, req uintptr, arg unsafe.Pointer) (uintptr, unix.Errno) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	return r, e
}

func ioctlAPI(fd int, a *uffdioAPI) unix.Errno {
	_, e := ioctl(fd, iocAPI, unsafe.Pointer(a))
	return e
}

func ioctlRegister(fd int, a *uffdioRegister) unix.Errno {
	_, e := ioctl(fd, iocRegister, unsafe.Pointer(a))
	return e
}

func ioctlRange(fd int, req uintptr, a *uffdioRange) unix.Errno {
	_, e := ioctl(fd, req, unsafe.Pointer(a))
	return e
}

func ioctlCopy(fd int, a *uffdioCopy) unix.Errno {
	_, e := ioctl(fd, iocCopy, unsafe.Pointer(a))
	return e
}

func ioctlZeropage(fd int, a *uffdioZeropage) unix.Errno {
	_, e := ioctl(fd, iocZeropage, unsafe.Pointer(a))
	return e
}

func ioctlWriteprotect(fd int, a *uffdioWriteprotect) unix.Errno {
	_, e := ioctl(fd, iocWriteprotect, unsafe.Pointer(a))
	return e
}

func ioctlContinue(fd int, a *uffdioContinue) unix.Errno {
	_, e := ioctl(fd, iocContinue, unsafe.Pointer(a))
	return e
}

func ioctlPoison(fd int, a *uffdioPoison) unix.Errno {
	_, e := ioctl(fd, iocPoison, unsafe.Pointer(a))
	return e
}

func ioctlMove(fd int, a *uffdioMove) unix.Errno {
	_, e := ioctl(fd, iocMove, unsafe.Pointer(a))
	return e
}

func ioctlPagemapScan(fd int, a *pmScanArg) (int, unix.Errno) {
	r, e := ioctl(fd, iocPagemapScan, unsafe.Pointer(a))
	return int(r), e
}

// msgBytes views msgs as the byte buffer read(2) fills.
func msgBytes(msgs []Msg) []byte {
	if len(msgs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&msgs[0])), len(msgs)*MsgSize)
}

// AddrOf returns the address of b's first byte, for registering memory this
// process mapped (for example with unix.Mmap). b must not be empty.
func AddrOf(b []byte) Addr {
	return Addr(unsafe.Pointer(unsafe.SliceData(b)))
}
