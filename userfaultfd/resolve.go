package userfaultfd

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Flags modify how a fault is resolved. Each operation accepts the flags
// its kernel ioctl has and rejects others with an OpError wrapping EINVAL.
type Flags uint8

const (
	// DontWake leaves the faulting threads asleep; call Wake later (for
	// example after several DontWake operations on neighbouring pages).
	DontWake Flags = 1 << iota
	// WriteProtected maps the pages write-protected (Copy, Continue).
	WriteProtected
	// AllowSrcHoles lets Move skip unpopulated source pages.
	AllowSrcHoles
)

func (f Flags) check(op string, allowed Flags, r Range) error {
	if f&^allowed != 0 {
		return &OpError{Op: op, Range: r, Err: fmt.Errorf("flags %#x not supported: %w", uint8(f&^allowed), unix.EINVAL)}
	}
	return nil
}

// done converts the kernel's progress field and the ioctl errno into the
// result of a batched operation. The kernel reports partial progress as
// EAGAIN with a positive count, and an error before any progress as
// -errno in the count.
func done(op string, r Range, count int64, e unix.Errno) (int, error) {
	if e == 0 {
		return int(r.Len), nil
	}
	n := max(count, 0)
	return int(n), &OpError{Op: op, Range: r, Done: n, Err: e}
}

// Copy atomically fills the pages at dst, in the served address space,
// with src (a whole number of pages, one page or a batch) and wakes the
// threads waiting on them unless DontWake is given. It returns the bytes
// copied. A page that is already mapped fails with an error for which
// IsExist is true (wake the range instead); IsMMChanged means partial
// progress or an address space change in flight. No allocation unless it
// fails.
func (u *UFFD) Copy(dst Addr, src []byte, flags Flags) (int, error) {
	r := Range{Start: dst, Len: uint64(len(src))}
	if err := pageRange(r); err != nil {
		return 0, err
	}
	if err := flags.check("copy", DontWake|WriteProtected, r); err != nil {
		return 0, err
	}
	a := uffdioCopy{Dst: uint64(dst), Src: &src[0], Len: r.Len}
	if flags&DontWake != 0 {
		a.Mode |= copyModeDontwake
	}
	if flags&WriteProtected != 0 {
		a.Mode |= copyModeWP
	}
	e := ioctlCopy(u.fd, &a)
	runtime.KeepAlive(src)
	return done("copy", r, a.Copy, e)
}

// ZeroPage maps zero pages over r (only for anonymous memory; a shared
// mapping gets EINVAL). Returns the bytes mapped.
func (u *UFFD) ZeroPage(r Range, flags Flags) (int, error) {
	if err := pageRange(r); err != nil {
		return 0, err
	}
	if err := flags.check("zeropage", DontWake, r); err != nil {
		return 0, err
	}
	a := uffdioZeropage{Range: uffdioRange{uint64(r.Start), r.Len}}
	if flags&DontWake != 0 {
		a.Mode |= zeropageModeDontwake
	}
	e := ioctlZeropage(u.fd, &a)
	return done("zeropage", r, a.Zeropage, e)
}

// Continue resolves MINOR faults on r by mapping the pages already in the
// page cache. Returns the bytes mapped.
func (u *UFFD) Continue(r Range, flags Flags) (int, error) {
	if err := pageRange(r); err != nil {
		return 0, err
	}
	if err := flags.check("continue", DontWake|WriteProtected, r); err != nil {
		return 0, err
	}
	a := uffdioContinue{Range: uffdioRange{uint64(r.Start), r.Len}}
	if flags&DontWake != 0 {
		a.Mode |= continueModeDontwake
	}
	if flags&WriteProtected != 0 {
		a.Mode |= continueModeWP
	}
	e := ioctlContinue(u.fd, &a)
	return done("continue", r, a.Mapped, e)
}

// Poison marks r so that any access raises SIGBUS (EFAULT for kernel
// accesses): for pages that are truly lost. Needs FeaturePoison.
func (u *UFFD) Poison(r Range, flags Flags) (int, error) {
	if err := pageRange(r); err != nil {
		return 0, err
	}
	if err := flags.check("poison", DontWake, r); err != nil {
		return 0, err
	}
	a := uffdioPoison{Range: uffdioRange{uint64(r.Start), r.Len}}
	if flags&DontWake != 0 {
		a.Mode |= poisonModeDontwake
	}
	e := ioctlPoison(u.fd, &a)
	return done("poison", r, a.Updated, e)
}

// Move moves length bytes of anonymous pages from src to dst, both in the
// served address space, without copying (the source becomes unmapped).
// Needs FeatureMove. Returns the bytes moved.
func (u *UFFD) Move(dst, src Addr, length uint64, flags Flags) (int, error) {
	r := Range{Start: dst, Len: length}
	if err := pageRange(r); err != nil {
		return 0, err
	}
	if err := pageRange(Range{Start: src, Len: length}); err != nil {
		return 0, err
	}
	if err := flags.check("move", DontWake|AllowSrcHoles, r); err != nil {
		return 0, err
	}
	a := uffdioMove{Dst: uint64(dst), Src: uint64(src), Len: length}
	if flags&DontWake != 0 {
		a.Mode |= moveModeDontwake
	}
	if flags&AllowSrcHoles != 0 {
		a.Mode |= moveModeAllowSrcHole
	}
	e := ioctlMove(u.fd, &a)
	return done("move", r, a.Move, e)
}

// WriteProtect write-protects r (registered with ModeWP): the next write
// to each page faults with FaultWP (or, with FeatureWPAsync, is resolved
// by the kernel and shows up in a DirtyScanner).
func (u *UFFD) WriteProtect(r Range) error {
	return u.writeProtect("writeprotect", r, wpModeWP)
}

// Unprotect removes write protection from r and wakes the threads waiting
// on it unless DontWake is given.
func (u *UFFD) Unprotect(r Range, flags Flags) error {
	if err := flags.check("unprotect", DontWake, r); err != nil {
		return err
	}
	var mode uint64
	if flags&DontWake != 0 {
		mode = wpModeDontwake
	}
	return u.writeProtect("unprotect", r, mode)
}

func (u *UFFD) writeProtect(op string, r Range, mode uint64) error {
	if err := pageRange(r); err != nil {
		return err
	}
	a := uffdioWriteprotect{Range: uffdioRange{uint64(r.Start), r.Len}, Mode: mode}
	if e := ioctlWriteprotect(u.fd, &a); e != 0 {
		return &OpError{Op: op, Range: r, Err: e}
	}
	return nil
}

// Wake wakes the threads waiting on faults in r without mapping anything:
// after DontWake operations, or after IsExist.
func (u *UFFD) Wake(r Range) error {
	if err := pageRange(r); err != nil {
		return err
	}
	a := uffdioRange{uint64(r.Start), r.Len}
	if e := ioctlRange(u.fd, iocWake, &a); e != 0 {
		return &OpError{Op: "wake", Range: r, Err: e}
	}
	return nil
}
