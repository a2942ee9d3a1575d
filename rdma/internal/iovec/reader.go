package iovec

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxBufs is the largest number of buffers one Readv call uses; extra
// buffers are ignored (the call reads less).
const MaxBufs = 64

// ErrWouldBlock is returned by Readv(wait=false) when no data is ready.
var ErrWouldBlock = errors.New("iovec: would block")

// Reader reads a net.Conn (or a detached descriptor: NewReaderFD) into
// buffer lists. It is used by one goroutine.
type Reader struct {
	nc net.Conn
	rc syscall.RawConn // nil: fallback to nc.Read

	iov  [MaxBufs]unix.Iovec
	niov int
	wait bool
	n    int
	err  error
	fn   func(fd uintptr) bool // preallocated readv callback

	deadline      time.Time // read deadline the caller wants
	deadlineDirty bool      // the conn's deadline may differ from deadline

	// threadWait: a blocking Readv waits in poll(2) on the calling thread
	// instead of parking the goroutine in Go's netpoller. stop is
	// Interrupt's flag for that wait.
	threadWait bool
	stop       atomic.Bool
}

// threadPollSlice bounds one poll(2) of a thread wait, so that Interrupt
// (which cannot wake a poll) is noticed within it.
const threadPollSlice = 10 * time.Millisecond

// SetThreadWait makes blocking reads wait in poll(2) on the calling OS
// thread rather than in Go's netpoller. For a goroutine locked to its
// thread (runtime.LockOSThread) a netpoller wait costs two thread
// hand-offs through the scheduler (the locked M gives its P away and
// sleeps; whoever finds the goroutine ready must wake that M), several
// times a loopback round trip on a small VM; a poll(2) wakes the thread
// directly. Call it before the first Readv.
func (r *Reader) SetThreadWait(on bool) { r.threadWait = on }

// SetDeadline sets the read deadline for blocking reads (zero: none). It
// only touches the connection when the value changes.
func (r *Reader) SetDeadline(t time.Time) error {
	if !r.deadlineDirty && t.Equal(r.deadline) {
		return nil
	}
	r.deadline, r.deadlineDirty = t, false
	r.stop.Store(false)
	if r.threadWait && r.rc != nil {
		return nil // pollIn applies it; the netpoller never waits
	}
	return r.nc.SetReadDeadline(t)
}

// Interrupt makes a blocked Readv return a timeout error soon; it may be
// called from another goroutine. The next SetDeadline restores the
// deadline.
func (r *Reader) Interrupt() {
	r.stop.Store(true)
	if r.nc != nil { // nil: detached (NewReaderFD), the flag is enough
		r.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// MarkDirty records that the connection's deadline is unknown (after
// Interrupt), so the next SetDeadline applies its value.
func (r *Reader) MarkDirty() { r.deadlineDirty = true }

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
			if r.wait && r.threadWait {
				if perr := r.pollIn(int(fd)); perr != nil {
					r.n, r.err = 0, perr
					return true
				}
				continue
			}
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

// pollIn waits on this thread until fd is readable, the deadline passes
// or Interrupt is called (both: os.ErrDeadlineExceeded).
func (r *Reader) pollIn(fd int) error {
	for {
		if r.stop.Load() {
			return os.ErrDeadlineExceeded
		}
		slice := threadPollSlice
		if !r.deadline.IsZero() {
			left := time.Until(r.deadline)
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			slice = min(slice, left)
		}
		pfd := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd[:], int((slice+time.Millisecond-1)/time.Millisecond))
		switch {
		case err == unix.EINTR:
		case err != nil:
			return err
		case n > 0:
			return nil // readable, or an error/hang-up readv will report
		}
	}
}

// Readv reads at least one byte into bufs, filling them in order, and
// returns the count. With wait false it returns ErrWouldBlock instead of
// blocking (the fallback path always does, before reading). End of stream
// is io.EOF. It does not allocate.
func (r *Reader) Readv(bufs [][]byte, wait bool) (int, error) {
	if r.rc == nil {
		return r.readFallback(bufs, wait)
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

// readFallback reads into the first non-empty buffer with nc.Read; without
// wait it polls by setting a deadline in the past.
func (r *Reader) readFallback(bufs [][]byte, wait bool) (int, error) {
	var dst []byte
	for _, b := range bufs {
		if len(b) > 0 {
			dst = b
			break
		}
	}
	if dst == nil {
		return 0, nil
	}
	if !wait {
		r.nc.SetReadDeadline(time.Unix(1, 0))
		r.deadlineDirty = true
	} else if r.deadlineDirty {
		if err := r.SetDeadline(r.deadline); err != nil {
			return 0, err
		}
	}
	n, err := r.nc.Read(dst)
	if err != nil && n == 0 && !wait && errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, ErrWouldBlock
	}
	if n > 0 {
		return n, nil
	}
	return n, err
}
