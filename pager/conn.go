package pager

// The client's connection: its socket and pidfd, answers with errnos,
// dropping it, and the liveness probe of a client without a pidfd.

import (
	"errors"
	"net"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
)

// socketState is the client's connection: the socket, the process's
// pidfd, the packet buffers and the sequence of requests.
type socketState struct {
	conn    *net.UnixConn
	sockfd  int
	pidfd   int
	sendBuf []byte
	recvBuf []byte
	oob     []byte
	seq     uint32
	probed  time.Time // last liveness probe (gone)
}

// probePeriod spaces the liveness probes of a client without a pidfd.
const probePeriod = time.Second

// set makes conn the connection (closing the one before), and opens a
// pidfd of process pid if there is none yet (pid 0: not known).
func (s *socketState) set(conn *net.UnixConn, pid int, log *zap.Logger) {
	if s.conn != nil {
		s.conn.Close()
	}
	s.conn, s.sockfd = conn, -1
	if rc, err := conn.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { s.sockfd = int(fd) })
	}
	if s.pidfd < 0 && pid > 0 {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			log.Warn("pidfd_open failed: exit is seen only through the socket", zap.Int("pid", pid), zap.Error(err))
		} else {
			s.pidfd = fd
		}
	}
}

// drop forgets the client's socket: faults are still served, eviction
// stops.
func (s *socketState) drop() {
	if s.conn != nil {
		s.conn.Close()
	}
	s.conn, s.sockfd = nil, -1
}

// close closes the socket and the pidfd (teardown).
func (s *socketState) close() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.pidfd >= 0 {
		unix.Close(s.pidfd)
	}
}

// recv reads the next packet, with the descriptors it carries in fds.
func (s *socketState) recv(fds []int) ([]byte, int, error) {
	return proto.Recv(s.conn, s.recvBuf, s.oob, fds)
}

// send sends m, a message of the agent's own (EVICT).
func (s *socketState) send(m proto.Message) error {
	s.seq++
	return proto.Send(s.conn, s.sendBuf, s.seq, m)
}

// reply answers request seq with ACK, or ERROR carrying err's errno.
func (s *socketState) reply(seq uint32, err error) error {
	if s.conn == nil {
		return net.ErrClosed // dropped meanwhile (a parked FORK_PREPARE's client)
	}
	return s.send(replyTo(seq, err))
}

// replyTo is the answer to request seq: ACK, or for err an ERROR with its
// errno (EINVAL if it has none).
func replyTo(seq uint32, err error) proto.Message {
	if err == nil {
		return &proto.Ack{Seq: seq}
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EINVAL
	}
	return &proto.Error{Seq: seq, Errno: errno, Text: err.Error()}
}

// probeDue reports whether a liveness probe is due at now, and if so
// counts it made.
func (s *socketState) probeDue(now time.Time) bool {
	if now.Sub(s.probed) < probePeriod {
		return false
	}
	s.probed = now
	return true
}

// readable reports whether fd has input (or a hang-up) now.
func readable(fd int) bool {
	p := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p[:], 0)
	return err == nil && n > 0
}

type errnoError struct {
	errno unix.Errno
	text  string
}

func (e *errnoError) Error() string { return "pager: " + e.text }

func (e *errnoError) Unwrap() error { return e.errno }

func errWithErrno(errno unix.Errno, text string) error { return &errnoError{errno, text} }
