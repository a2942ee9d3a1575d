package userfaultfd

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

const devUserfaultfd = "/dev/userfaultfd"

// UFFD is a userfaultfd file descriptor after the API handshake. Its
// methods may be called from several goroutines at once, except Close,
// which must not race with any method but Poller waits (it stops them
// first).
type UFFD struct {
	fd        int
	features  Feature // enabled by the handshake
	available Feature // offered by the kernel (0 if unknown)
	ioctls    Ioctls  // fd-level ioctls from the handshake (0 if unknown)

	mu     sync.Mutex
	closed bool
	poller *Poller
}

// Open creates a non-blocking, close-on-exec userfaultfd and negotiates
// features with the kernel. It tries /dev/userfaultfd first
// (USERFAULTFD_IOC_NEW), then the userfaultfd(2) system call. Kernel-side
// faults (copy_to_user into a registered range) are delivered too: the fd
// is never UFFD_USER_MODE_ONLY.
//
// If the kernel lacks a requested feature, the error wraps ErrFeature and
// names the missing features; if no userfaultfd can be created, it wraps
// ErrUnavailable and the errno and says what to check.
func Open(features Feature) (*UFFD, error) {
	fd, err := newFD()
	if err != nil {
		return nil, err
	}
	return handshake(fd, features)
}

// OpenDevice is Open through dev, an open descriptor of /dev/userfaultfd
// (lent by a process that may open it, such as memagent): the new uffd
// belongs to the caller's address space whatever the caller's own rights.
// dev stays the caller's.
func OpenDevice(dev int, features Feature) (*UFFD, error) {
	fd, err := newFDOn(dev)
	if err != nil {
		return nil, err
	}
	return handshake(fd, features)
}

// ProbeDevice is Probe through dev (see OpenDevice).
func ProbeDevice(dev int) (Feature, Ioctls, error) {
	fd, err := newFDOn(dev)
	if err != nil {
		return 0, 0, err
	}
	return probe(fd)
}

func newFDOn(dev int) (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), iocUserfaultfdNew, unix.O_CLOEXEC|unix.O_NONBLOCK)
	if e != 0 {
		return -1, fmt.Errorf("%w: USERFAULTFD_IOC_NEW on fd %d: %w", ErrUnavailable, dev, e)
	}
	return int(fd), nil
}

// Handshake negotiates features (UFFDIO_API) on fd, a userfaultfd made
// by another process and taken from it (pidfd_getfd(2): how package traced
// pages a program from outside it). The UFFD owns fd from now on, and
// closes it on failure. The uffd serves the address space of the process
// that made it, whoever holds it.
func Handshake(fd int, features Feature) (*UFFD, error) { return handshake(fd, features) }

// handshake negotiates features on fd, which it owns from now on.
func handshake(fd int, features Feature) (*UFFD, error) {
	api := uffdioAPI{API: uffdAPI, Features: uint64(features)}
	if e := ioctlAPI(fd, &api); e != 0 {
		unix.Close(fd)
		return nil, handshakeError(features, e)
	}
	enabled := features
	if enabled.Has(FeatureWPAsync) {
		enabled |= FeatureWPUnpopulated // the kernel implies it
	}
	return &UFFD{
		fd:        fd,
		features:  enabled,
		available: Feature(api.Features),
		ioctls:    Ioctls(api.Ioctls),
	}, nil
}

// FromFD wraps fd, a userfaultfd on which the API handshake was already
// done (typically by the process that received it over a Unix socket),
// with the features that handshake enabled. It sets O_NONBLOCK on the open
// file (shared with every holder of the fd). The UFFD owns fd from now on.
func FromFD(fd int, enabled Feature) (*UFFD, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("userfaultfd: set O_NONBLOCK on fd %d: %w", fd, err)
	}
	return &UFFD{fd: fd, features: enabled}, nil
}

// Probe returns the features and fd-level ioctls the running kernel
// offers, using a throw-away userfaultfd.
func Probe() (Feature, Ioctls, error) {
	fd, err := newFD()
	if err != nil {
		return 0, 0, err
	}
	return probe(fd)
}

// probe does the API handshake on fd, a throw-away uffd it closes.
func probe(fd int) (Feature, Ioctls, error) {
	defer unix.Close(fd)
	api := uffdioAPI{API: uffdAPI}
	if e := ioctlAPI(fd, &api); e != 0 {
		return 0, 0, fmt.Errorf("userfaultfd: UFFDIO_API handshake: %w", e)
	}
	return Feature(api.Features), Ioctls(api.Ioctls), nil
}

func newFD() (int, error) { return newFDFrom(devUserfaultfd) }

// newFDFrom creates a uffd through the device at path, or with the system
// call if that fails.
func newFDFrom(path string) (int, error) {
	const flags = unix.O_CLOEXEC | unix.O_NONBLOCK
	dev, devErr := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if devErr == nil {
		fd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), iocUserfaultfdNew, flags)
		unix.Close(dev)
		if e == 0 {
			return int(fd), nil
		}
		devErr = fmt.Errorf("USERFAULTFD_IOC_NEW: %w", e)
	}
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, flags, 0, 0)
	if e == 0 {
		return int(fd), nil
	}
	var hint string
	switch e {
	case unix.ENOSYS:
		hint = "the kernel was built without CONFIG_USERFAULTFD"
	case unix.EPERM, unix.EACCES:
		hint = "run as root or with CAP_SYS_PTRACE, give this user read/write access to " +
			path + ", or set sysctl vm.unprivileged_userfaultfd=1"
	default:
		hint = "check " + path + " and sysctl vm.unprivileged_userfaultfd"
	}
	return -1, fmt.Errorf("%w: %s: %v; userfaultfd(2): %w (%s)", ErrUnavailable, path, devErr, e, hint)
}

func handshakeError(requested Feature, e unix.Errno) error {
	if e == unix.EPERM && requested.Has(FeatureEventFork) {
		return fmt.Errorf("%w: EVENT_FORK needs CAP_SYS_PTRACE: %w", ErrFeature, e)
	}
	if e != unix.EINVAL {
		return fmt.Errorf("userfaultfd: UFFDIO_API handshake for %v: %w", requested, e)
	}
	avail, _, err := Probe()
	if err != nil {
		return fmt.Errorf("userfaultfd: UFFDIO_API handshake for %v: %w (probe: %v)", requested, e, err)
	}
	missing := requested &^ avail
	if missing == 0 {
		return fmt.Errorf("userfaultfd: UFFDIO_API handshake for %v: %w", requested, e)
	}
	return fmt.Errorf("%w: kernel lacks %v (it offers %v): %w", ErrFeature, missing, avail, e)
}

// Fd returns the file descriptor, for passing it to another process or
// polling it elsewhere. It stays owned by the UFFD.
func (u *UFFD) Fd() int { return u.fd }

// Features returns the features the handshake enabled.
func (u *UFFD) Features() Feature { return u.features }

// Available returns the features the kernel offered in the handshake, or 0
// for a UFFD made by FromFD.
func (u *UFFD) Available() Feature { return u.available }

// Ioctls returns the fd-level ioctls granted by the handshake, or 0 for a
// UFFD made by FromFD.
func (u *UFFD) Ioctls() Ioctls { return u.ioctls }

// Close stops an attached Poller (waiting for its Wait to return) and
// closes the fd. Threads still blocked in faults of this uffd are woken
// with zero-filled pages by the kernel unless another process holds the fd
// too. Safe to call twice.
func (u *UFFD) Close() error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	u.closed = true
	p := u.poller
	u.mu.Unlock()
	if p != nil {
		p.stopAndDrain()
	}
	return unix.Close(u.fd)
}

// Register starts reporting faults of r in the given modes and returns the
// ioctls the kernel allows on r. r must be page aligned.
func (u *UFFD) Register(r Range, mode Mode) (Ioctls, error) {
	if err := pageRange(r); err != nil {
		return 0, err
	}
	reg := uffdioRegister{Range: uffdioRange{uint64(r.Start), r.Len}, Mode: uint64(mode)}
	if e := ioctlRegister(u.fd, &reg); e != 0 {
		return 0, &OpError{Op: "register " + mode.String(), Range: r, Err: e}
	}
	return Ioctls(reg.Ioctls), nil
}

// Unregister stops reporting faults of r and wakes threads blocked in it.
func (u *UFFD) Unregister(r Range) error {
	if err := pageRange(r); err != nil {
		return err
	}
	a := uffdioRange{uint64(r.Start), r.Len}
	if e := ioctlRange(u.fd, iocUnregister, &a); e != 0 {
		return &OpError{Op: "unregister", Range: r, Err: e}
	}
	return nil
}

// ReadEvents reads as many pending messages as fit in msgs without
// blocking and returns how many it read. With nothing pending it returns
// unix.EAGAIN unwrapped. It allocates nothing. Decode each with Msg.Decode;
// FORK messages carry a new fd that the caller then owns.
func (u *UFFD) ReadEvents(msgs []Msg) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	for {
		n, err := unix.Read(u.fd, msgBytes(msgs))
		switch {
		case err == nil:
			if n%MsgSize != 0 {
				return 0, fmt.Errorf("%w: read returned %d bytes", ErrBadMsg, n)
			}
			return n / MsgSize, nil
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, unix.EAGAIN
		case errors.Is(err, unix.EBADF):
			return 0, fmt.Errorf("%w: read: %w", ErrClosed, err)
		default:
			return 0, fmt.Errorf("userfaultfd: read events: %w", err)
		}
	}
}
