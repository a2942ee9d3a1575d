package proto

import (
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// OOBSize is the control buffer Recv needs to receive up to MaxFDs
// descriptors.
var OOBSize = unix.CmsgSpace(4 * MaxFDs)

// Dial connects to the agent socket at path (SOCK_SEQPACKET).
func Dial(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("proto: connect to agent: %w", err)
	}
	return c, nil
}

// Listen creates the agent's SOCK_SEQPACKET listener at path.
func Listen(path string) (*net.UnixListener, error) {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("proto: listen: %w", err)
	}
	return l, nil
}

// Send encodes m with seq into buf (reused: pass buf[:0] of a
// MaxPacket-capacity buffer to avoid allocation) and sends it as one
// packet with fds as SCM_RIGHTS. The fds stay open in the sender.
func Send(c *net.UnixConn, buf []byte, seq uint32, m Message, fds ...int) error {
	pkt := m.Encode(buf[:0], seq)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(pkt, oob, nil)
	if err != nil {
		return fmt.Errorf("proto: send %v: %w", m.Type(), err)
	}
	if n != len(pkt) || oobn != len(oob) {
		return fmt.Errorf("%w: sent %d/%d bytes, %d/%d control bytes of %v", ErrTruncated, n, len(pkt), oobn, len(oob), m.Type())
	}
	return nil
}

// Recv receives one packet into buf (at least MaxPacket bytes) and up to
// len(fds) descriptors (close-on-exec) into fds, using oob (at least
// OOBSize bytes) for the control message. It returns the packet (a
// prefix of buf) and the number of descriptors. A packet or descriptor
// list that did not fit is an error wrapping ErrTruncated, and every
// descriptor that did arrive is closed. At end of stream it returns
// io.EOF. It does not parse the packet: use Parse or Expect.
func Recv(c *net.UnixConn, buf, oob []byte, fds []int) (pkt []byte, nfds int, err error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, 0, fmt.Errorf("proto: receive: %w", err)
	}
	var got []int
	if oobn > 0 {
		got, err = parseRights(oob[:oobn])
		if err != nil {
			return nil, 0, err
		}
	}
	switch {
	case flags&unix.MSG_TRUNC != 0:
		closeAll(got)
		return nil, 0, fmt.Errorf("%w: packet larger than the %d-byte buffer", ErrTruncated, len(buf))
	case flags&unix.MSG_CTRUNC != 0 || len(got) > len(fds):
		closeAll(got)
		return nil, 0, fmt.Errorf("%w: more descriptors than the %d expected", ErrTruncated, len(fds))
	case n == 0 && len(got) == 0:
		return nil, 0, io.EOF
	}
	return buf[:n], copy(fds, got), nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %w", ErrMalformed, err)
	}
	var got []int
	for i := range msgs {
		rights, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // another kind of control message
		}
		got = append(got, rights...)
	}
	return got, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
