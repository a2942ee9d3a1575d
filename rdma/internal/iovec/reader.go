package iovec

import (
	"errors"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxBufs is the largest number of buffers one Readv call uses; extra
// buffers are ignored (the call reads less).
const MaxBufs = 64

// ErrWouldBlock is returned by Readv(wait=false) when no data is ready.
var ErrWouldBlock = errors.New("iovec: would block")

// Reader reads a net.Conn into buffer lists. It is used by one goroutine.
type Reader struct {
	nc net.Conn
	rc syscall.RawConn // nil: fallback to nc.Read

	iov  [MaxBufs]unix.Iovec
	niov int
	wait bool
	n    int
	err  error
	fn   func(fd uintptr) bool // preallocated readv callback
}

// NewReader returns a Reader for nc. It uses readv(2) when nc is a
// *net.TCPConn or *net.UnixConn.
func NewReader(nc net.Conn) *Reader {
	r := &Reader{nc: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		switch nc.(type) {
		case *net.TCPConn, *net.UnixConn:
			if rc, err := sc.SyscallConn(); err == nil {
				r.rc = rc
			}
		}
	}
	r.fn = r.readvFD
	return r
}

// Vectored reports whether reads go straight to the buffers with readv.
func (r *Reader) Vectored() bool { return r.rc != nil }

func (r *Reader) readvFD(fd uintptr) bool {
	for {
		n, err := readv(int(fd), r.iov[:r.niov])
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if r.wait {
				return false // let the poller wait for readability
			}
			r.n, r.err = 0, ErrWouldBlock
			return true
		}
		r.n, r.err = n, err
		return true
	}
}

// Readv reads at least one byte into bufs, filling them in order, and
// returns the count. With wait false it returns ErrWouldBlock instead of
// blocking (the fallback path always does, before reading). End of stream
// is io.EOF. It does not allocate.
func (r *Reader) Readv(bufs [][]byte, wait bool) (int, error) {
	if r.rc == nil {
		if !wait {
			return 0, ErrWouldBlock
		}
		for _, b := range bufs {
			if len(b) > 0 {
				return r.nc.Read(b)
			}
		}
		return 0, nil
	}
	r.niov = 0
	total := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if r.niov == MaxBufs {
			break
		}
		r.iov[r.niov] = unix.Iovec{Base: &b[0]}
		r.iov[r.niov].SetLen(len(b))
		r.niov++
		total += len(b)
	}
	if total == 0 {
		return 0, nil
	}
	r.wait = wait
	if err := r.rc.Read(r.fn); err != nil {
		r.clear()
		return 0, err
	}
	r.clear()
	if r.err != nil {
		return 0, r.err
	}
	if r.n == 0 {
		return 0, io.EOF
	}
	return r.n, nil
}

// clear drops the pointers into the caller's buffers.
func (r *Reader) clear() {
	for i := range r.niov {
		r.iov[i] = unix.Iovec{}
	}
}
