package iovec

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Writer writes buffer lists to a net.Conn with writev(2) without
// blocking, so that a caller whose peer is not reading can do something
// else (read the peer's replies) instead of deadlocking.
type Writer struct {
	rc syscall.RawConn // nil: not vectored (TLS)

	iov  [MaxBufs]unix.Iovec
	niov int
	n    int
	err  error
	wait bool
	fn   func(fd uintptr) bool

	pollEvents int16
	pollWait   time.Duration
	pollRev    int16
	pollErr    error
	pollFn     func(fd uintptr)
}

// NewWriter returns a Writer for nc (vectored for *net.TCPConn and
// *net.UnixConn).
func NewWriter(nc net.Conn) *Writer {
	w := &Writer{}
	switch c := nc.(type) {
	case *net.TCPConn:
		w.rc, _ = c.SyscallConn()
	case *net.UnixConn:
		w.rc, _ = c.SyscallConn()
	}
	w.fn = w.writevFD
	w.pollFn = w.pollFD
	return w
}

// Vectored reports whether Writev can be used.
func (w *Writer) Vectored() bool { return w.rc != nil }

func (w *Writer) writevFD(fd uintptr) bool {
	for {
		n, err := writev(int(fd), w.iov[:w.niov])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if w.wait {
				return false // let the poller wait for room
			}
			n, err = 0, ErrWouldBlock
		}
		w.n, w.err = n, err
		return true
	}
}

// Writev writes as much of bufs as the socket takes now and returns the
// count. With wait false and nothing written it returns ErrWouldBlock;
// with wait true it blocks until it can write something. It does not
// allocate.
func (w *Writer) Writev(bufs [][]byte, wait bool) (int, error) {
	w.wait = wait
	w.niov = 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if w.niov == MaxBufs {
			break
		}
		w.iov[w.niov] = unix.Iovec{Base: &b[0]}
		w.iov[w.niov].SetLen(len(b))
		w.niov++
	}
	if w.niov == 0 {
		return 0, nil
	}
	err := w.rc.Write(w.fn)
	for i := range w.niov {
		w.iov[i] = unix.Iovec{}
	}
	if err != nil {
		return 0, err
	}
	return w.n, w.err
}

func (w *Writer) pollFD(fd uintptr) {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: w.pollEvents}}
	_, w.pollErr = unix.Poll(fds[:], int(w.pollWait/time.Millisecond))
	if w.pollErr == unix.EINTR {
		w.pollErr = nil
	}
	w.pollRev = fds[0].Revents
}

// Poll waits up to d (a few milliseconds: the connection cannot be closed
// meanwhile) until the socket is readable (if read) or writable.
func (w *Writer) Poll(read bool, d time.Duration) (readable, writable bool, err error) {
	w.pollEvents = unix.POLLOUT
	if read {
		w.pollEvents |= unix.POLLIN
	}
	w.pollWait = d
	if err := w.rc.Control(w.pollFn); err != nil {
		return false, false, err
	}
	if w.pollErr != nil {
		return false, false, w.pollErr
	}
	return w.pollRev&unix.POLLIN != 0, w.pollRev&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) != 0, nil
}

// Advance drops the first n bytes of bufs (in place) and returns the rest.
func Advance(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n < len(bufs[0]) {
			bufs[0] = bufs[0][n:]
			return bufs
		}
		n -= len(bufs[0])
		bufs[0] = nil
		bufs = bufs[1:]
	}
	for len(bufs) > 0 && len(bufs[0]) == 0 {
		bufs[0] = nil
		bufs = bufs[1:]
	}
	return bufs
}
