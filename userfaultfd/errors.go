package userfaultfd

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

var (
	// ErrUnavailable: the kernel or the caller's privileges do not allow
	// creating a userfaultfd. The wrapped errno says which.
	ErrUnavailable = errors.New("userfaultfd: not available")
	// ErrFeature: the kernel does not offer a requested feature.
	ErrFeature = errors.New("userfaultfd: feature not supported")
	// ErrRange: an address range is empty, unaligned or wraps around.
	ErrRange = errors.New("userfaultfd: bad range")
	// ErrClosed: the UFFD or Poller was closed.
	ErrClosed = errors.New("userfaultfd: closed")
	// ErrStopped: the Poller was stopped (Stop, Close or context end).
	ErrStopped = errors.New("userfaultfd: poller stopped")
	// ErrBadMsg: a uffd_msg could not be decoded.
	ErrBadMsg = errors.New("userfaultfd: malformed message")
	// ErrFDPass: a message over a Unix socket carried no, too few or
	// truncated file descriptors.
	ErrFDPass = errors.New("userfaultfd: bad fd passing message")
)

// OpError reports a failed ioctl on a range, with the progress the kernel
// made before failing (Done bytes, for Copy, ZeroPage, Continue, Move and
// Poison). Unwrap yields the errno, so errors.Is(err, unix.EEXIST) works.
type OpError struct {
	Op    string
	Range Range
	Done  int64
	Err   error
}

func (e *OpError) Error() string {
	if e.Done > 0 {
		return fmt.Sprintf("userfaultfd: %s %v: %v (after %d bytes)", e.Op, e.Range, e.Err, e.Done)
	}
	return fmt.Sprintf("userfaultfd: %s %v: %v", e.Op, e.Range, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

// IsExist reports whether err says the page is already mapped: a repeated
// fault message or a concurrent resolver got there first. The faulting
// thread may still be asleep, so the usual answer is Wake on the range.
func IsExist(err error) bool { return errors.Is(err, unix.EEXIST) }

// IsMMChanged reports whether err says the served address space is being
// changed (fork, mremap, munmap in flight) or that a batched operation
// stopped early (OpError.Done > 0): read pending events, then retry the
// rest.
func IsMMChanged(err error) bool { return errors.Is(err, unix.EAGAIN) }

// IsGone reports whether err says the served address space or the target
// mapping no longer exists (the process exited or unmapped the range).
func IsGone(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT)
}
