package iovec

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Detach takes nc's socket out of Go's netpoller: it returns a duplicate
// of its descriptor (non-blocking, close-on-exec) and closes nc, which
// removes the socket from the runtime's epoll set. The caller owns the
// descriptor: read and write it with NewReaderFD and NewWriterFD, and
// close it when no call uses it any more.
//
// Why: a socket the netpoller watches wakes the runtime's poller thread
// for every packet that arrives, even while its reader polls it with
// non-blocking reads on its own thread (thread wait, spinning) and will
// find the packet itself. On a small VM that is a wake-up of a halted
// vCPU per reply, for nothing.
func Detach(nc net.Conn) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("iovec: detach: %T has no descriptor", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("iovec: detach: %w", err)
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, fmt.Errorf("iovec: detach: %w", err)
	}
	if derr != nil {
		return -1, fmt.Errorf("iovec: detach: dup: %w", derr)
	}
	nc.Close()
	return fd, nil
}

// NewReaderFD returns a Reader for a detached descriptor (Detach). Its
// blocking reads wait in poll(2) on the calling thread (thread wait);
// Interrupt ends them within threadPollSlice, and so does shutdown(2) of
// the socket, at once.
func NewReaderFD(fd int) *Reader {
	r := &Reader{rc: fdConn(fd), threadWait: true}
	r.fn = r.readvFD
	return r
}

// NewWriterFD returns a Writer for a detached descriptor (Detach). A
// blocking Writev waits in poll(2) on the calling thread.
func NewWriterFD(fd int) *Writer {
	w := &Writer{rc: fdConn(fd)}
	w.fn = w.writevFD
	w.pollFn = w.pollFD
	return w
}

// fdConn is a syscall.RawConn over a detached descriptor: where the
// netpoller would wait for readiness, the calling thread polls.
type fdConn int

func (f fdConn) Control(fn func(uintptr)) error { fn(uintptr(f)); return nil }

func (f fdConn) Read(fn func(uintptr) bool) error {
	for !fn(uintptr(f)) {
		if err := pollWait(int(f), unix.POLLIN); err != nil {
			return err
		}
	}
	return nil
}

func (f fdConn) Write(fn func(uintptr) bool) error {
	for !fn(uintptr(f)) {
		if err := pollWait(int(f), unix.POLLOUT); err != nil {
			return err
		}
	}
	return nil
}

// pollWait blocks until fd has one of events (or an error or hang-up,
// which the next call reports).
func pollWait(fd int, events int16) error {
	for {
		pfd := [1]unix.PollFd{{Fd: int32(fd), Events: events}}
		_, err := unix.Poll(pfd[:], -1)
		if err != unix.EINTR {
			return err
		}
	}
}
