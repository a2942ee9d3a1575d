package verbs

import (
	"encoding/binary"
	"fmt"
	"io"

	"rmem/rdma"
)

// Control protocol, version 1: the out-of-band exchange over TCP that sets
// up the RC queue pairs and hands out verbs rkeys. Every message is
// msgSize bytes, little endian:
//
//	0  magic "RMVB"   4  version u8 (1)   5  type u8   6  status u8   7  access u8
//	8  payload (56 bytes), by type:
//
//	HELLO, RECONNECT (client) / WELCOME, RECONNECTED (server): a QP endpoint
//	  8 qpn u32   12 psn u32   16 lid u16   18 mtu u8 (ibv_mtu)   19 reserved u8
//	  20 gid [16]   36 depth u32 (client: queue depth; server: 0)
//	RESOLVE (client): 8 key [16]
//	GRANT (server): status is an rdma.Status; when OK, access is the key's
//	  rdma.Access and 8 rkey u32   12 reserved u32   16 addr u64   24 len u64
//	  32 key [16] (as resolved)
//
// The client sends HELLO, the server answers WELCOME (status 0) or closes.
// Then the client sends RESOLVE or RECONNECT, one at a time, and the server
// answers each with GRANT or RECONNECTED. A malformed message closes the
// connection.
const (
	protoVersion = 1
	msgSize      = 64
)

var protoMagic = [4]byte{'R', 'M', 'V', 'B'}

type msgType uint8

const (
	msgHello msgType = 1 + iota
	msgWelcome
	msgResolve
	msgGrant
	msgReconnect
	msgReconnected
	numMsg
)

// endpoint is one side of an RC connection: what the peer needs to move
// its QP to RTR.
type endpoint struct {
	QPN   uint32
	PSN   uint32
	LID   uint16
	MTU   uint8 // ibv_mtu enum (1 = 256 ... 5 = 4096)
	GID   [16]byte
	Depth uint32
}

// grant is the server's answer to RESOLVE.
type grant struct {
	Status rdma.Status
	Access rdma.Access
	RKey   uint32
	Addr   uint64
	Len    uint64
	Key    rdma.Key
}

// msg is one decoded control message.
type msg struct {
	Type msgType
	EP   endpoint // HELLO, WELCOME, RECONNECT, RECONNECTED
	Key  rdma.Key // RESOLVE
	G    grant    // GRANT
}

func putHeader(b []byte, t msgType, status uint8, acc rdma.Access) {
	clear(b[:msgSize])
	copy(b[0:4], protoMagic[:])
	b[4] = protoVersion
	b[5] = uint8(t)
	b[6] = status
	b[7] = uint8(acc)
}

func encode(b []byte, m *msg) {
	_ = b[msgSize-1]
	switch m.Type {
	case msgHello, msgWelcome, msgReconnect, msgReconnected:
		putHeader(b, m.Type, 0, 0)
		binary.LittleEndian.PutUint32(b[8:], m.EP.QPN)
		binary.LittleEndian.PutUint32(b[12:], m.EP.PSN)
		binary.LittleEndian.PutUint16(b[16:], m.EP.LID)
		b[18] = m.EP.MTU
		copy(b[20:36], m.EP.GID[:])
		binary.LittleEndian.PutUint32(b[36:], m.EP.Depth)
	case msgResolve:
		putHeader(b, m.Type, 0, 0)
		copy(b[8:24], m.Key[:])
	case msgGrant:
		putHeader(b, m.Type, uint8(m.G.Status), m.G.Access)
		binary.LittleEndian.PutUint32(b[8:], m.G.RKey)
		binary.LittleEndian.PutUint64(b[16:], m.G.Addr)
		binary.LittleEndian.PutUint64(b[24:], m.G.Len)
		copy(b[32:48], m.G.Key[:])
	default:
		panic(fmt.Sprintf("verbs: encode of message type %d", m.Type))
	}
}

// decode parses one message. Anything malformed wraps rdma.ErrProtocol (a
// different version: rdma.ErrVersion); the caller closes the connection.
func decode(b []byte) (msg, error) {
	var m msg
	if len(b) != msgSize {
		return m, fmt.Errorf("%w: verbs control message of %d bytes, want %d", rdma.ErrProtocol, len(b), msgSize)
	}
	if [4]byte(b[0:4]) != protoMagic {
		return m, fmt.Errorf("%w: bad verbs control magic %q", rdma.ErrProtocol, b[0:4])
	}
	if b[4] != protoVersion {
		return m, fmt.Errorf("%w: verbs control version %d, want %d", rdma.ErrVersion, b[4], protoVersion)
	}
	m.Type = msgType(b[5])
	status, acc := b[6], rdma.Access(b[7])
	switch m.Type {
	case msgHello, msgWelcome, msgReconnect, msgReconnected:
		if status != 0 || acc != 0 {
			return m, fmt.Errorf("%w: verbs %s with status %d access %d", rdma.ErrProtocol, m.Type, status, acc)
		}
		m.EP = endpoint{
			QPN: binary.LittleEndian.Uint32(b[8:]), PSN: binary.LittleEndian.Uint32(b[12:]),
			LID: binary.LittleEndian.Uint16(b[16:]), MTU: b[18], GID: [16]byte(b[20:36]),
			Depth: binary.LittleEndian.Uint32(b[36:]),
		}
		if m.EP.QPN == 0 || m.EP.QPN >= 1<<24 || m.EP.PSN >= 1<<24 || m.EP.MTU < 1 || m.EP.MTU > 5 {
			return m, fmt.Errorf("%w: verbs %s endpoint %+v out of range", rdma.ErrProtocol, m.Type, m.EP)
		}
		if m.EP.Depth > rdma.MaxDepth || (m.Type == msgHello && m.EP.Depth == 0) {
			return m, fmt.Errorf("%w: verbs %s depth %d", rdma.ErrProtocol, m.Type, m.EP.Depth)
		}
	case msgResolve:
		if status != 0 || acc != 0 {
			return m, fmt.Errorf("%w: verbs RESOLVE with status %d access %d", rdma.ErrProtocol, status, acc)
		}
		m.Key = rdma.Key(b[8:24])
	case msgGrant:
		m.G = grant{
			Status: rdma.Status(status), Access: acc,
			RKey: binary.LittleEndian.Uint32(b[8:]), Addr: binary.LittleEndian.Uint64(b[16:]),
			Len: binary.LittleEndian.Uint64(b[24:]), Key: rdma.Key(b[32:48]),
		}
		switch {
		case !m.G.Status.Valid() || m.G.Status == rdma.StatusTransport:
			return m, fmt.Errorf("%w: verbs GRANT status %d", rdma.ErrProtocol, status)
		case m.G.Status == rdma.StatusOK && (!acc.Valid() || m.G.Len == 0 || m.G.Addr+m.G.Len < m.G.Addr):
			return m, fmt.Errorf("%w: verbs GRANT access %d range [%#x, +%d)", rdma.ErrProtocol, acc, m.G.Addr, m.G.Len)
		case m.G.Status != rdma.StatusOK && acc != 0:
			return m, fmt.Errorf("%w: verbs GRANT refusal with access %d", rdma.ErrProtocol, acc)
		}
	default:
		return m, fmt.Errorf("%w: verbs control message type %d", rdma.ErrProtocol, b[5])
	}
	return m, nil
}

func (t msgType) String() string {
	switch t {
	case msgHello:
		return "HELLO"
	case msgWelcome:
		return "WELCOME"
	case msgResolve:
		return "RESOLVE"
	case msgGrant:
		return "GRANT"
	case msgReconnect:
		return "RECONNECT"
	case msgReconnected:
		return "RECONNECTED"
	}
	return fmt.Sprintf("msgType(%d)", uint8(t))
}

// readMsg reads and decodes one message into buf (msgSize bytes).
func readMsg(r io.Reader, buf []byte) (msg, error) {
	if _, err := io.ReadFull(r, buf[:msgSize]); err != nil {
		return msg{}, err
	}
	return decode(buf[:msgSize])
}

// writeMsg encodes and writes one message using buf (msgSize bytes).
func writeMsg(w io.Writer, buf []byte, m *msg) error {
	encode(buf[:msgSize], m)
	_, err := w.Write(buf[:msgSize])
	return err
}
