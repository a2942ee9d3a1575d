package userfaultfd

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// uffdUserModeOnly is UFFD_USER_MODE_ONLY (linux/userfaultfd.h, 5.11+).
const uffdUserModeOnly = 1

// OpenUserMode is Open for faults from user mode only
// (UFFD_USER_MODE_ONLY): any process may create such a uffd, also where
// vm.unprivileged_userfaultfd is 0 and /dev/userfaultfd is root's, but a
// fault the kernel takes on the process's behalf (read(2) into a missing
// page, a futex on it, ...) is not delivered: that access fails with
// EFAULT. It suits programs that touch their registered memory only from
// their own code (the pager's tests as an unprivileged user); a real
// program under the shim needs Open. FeatureEventFork is refused
// (EPERM) without CAP_SYS_PTRACE.
func OpenUserMode(features Feature) (*UFFD, error) {
	fd, err := newUserModeFD()
	if err != nil {
		return nil, err
	}
	return handshake(fd, features)
}

// ProbeUserMode is Probe for a uffd of OpenUserMode.
func ProbeUserMode() (Feature, Ioctls, error) {
	fd, err := newUserModeFD()
	if err != nil {
		return 0, 0, err
	}
	return probe(fd)
}

func newUserModeFD() (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	if e != 0 {
		return -1, fmt.Errorf("%w: userfaultfd(2) with UFFD_USER_MODE_ONLY: %w (kernels before 5.11 lack it)", ErrUnavailable, e)
	}
	return int(fd), nil
}
