package pager

// The client's connection: answers, errors with errnos, dropping it.

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
)

// dropConn forgets the client's socket: faults are still served, eviction
// stops.
func (c *client) dropConn() {
	if c.sock.conn != nil {
		c.sock.conn.Close()
	}
	c.sock.conn, c.sock.sockfd = nil, -1
}

// readable reports whether fd has input (or a hang-up) now.
func readable(fd int) bool {
	p := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p[:], 0)
	return err == nil && n > 0
}

// reply answers request seq with ACK, or ERROR carrying err's errno.
func (c *client) reply(seq uint32, err error) error {
	if c.sock.conn == nil {
		return net.ErrClosed // dropped meanwhile (a parked FORK_PREPARE's client)
	}
	c.sock.seq++
	if err == nil {
		return proto.Send(c.sock.conn, c.sock.sendBuf, c.sock.seq, &proto.Ack{Seq: seq})
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EINVAL
	}
	return proto.Send(c.sock.conn, c.sock.sendBuf, c.sock.seq, &proto.Error{Seq: seq, Errno: errno, Text: err.Error()})
}

type errnoError struct {
	errno unix.Errno
	text  string
}

func (e *errnoError) Error() string { return "pager: " + e.text }

func (e *errnoError) Unwrap() error { return e.errno }

func errWithErrno(errno unix.Errno, text string) error { return &errnoError{errno, text} }
