package tcp

import (
	"encoding/binary"
	"fmt"

	"rmem/rdma"
)

// Wire format, version 1, little endian.
//
// A connection starts with a hello each way (client first):
//
//	0  magic "RMRD"   4  version u16   6  reserved u16 (0)
//	8  maxTransfer u32   12 reserved u32 (0)
//
// The server answers a hello of another version with its own hello and
// closes; the client reports ErrVersion.
//
// Then the client sends requests and the server answers each, in order:
//
//	request (56 bytes)                      reply (24 bytes)
//	0  version u8 (1)                       0  version u8 (1)
//	1  opcode u8                            1  opcode u8 (as requested)
//	2  flags u16 (0)                        2  status u8
//	4  length u32                           3  reserved u8 (0)
//	8  id u64                               4  length u32
//	16 key [16]                             8  id u64 (as requested)
//	32 offset u64                           16 value u64 (atomics: old value)
//	40 compare u64 (COMPARE_AND_SWAP)
//	48 operand u64 (swap, or FETCH_ADD addend)
//
// A WRITE request is followed by length payload bytes; a READ reply with
// status OK is followed by length payload bytes. Error replies carry no
// payload and length 0. Atomics have length 8. The client uses the
// connection's sequence number as id and checks it on every reply.
const (
	version   = 1
	helloSize = 16
	reqSize   = 56
	replySize = 24
)

var helloMagic = [4]byte{'R', 'M', 'R', 'D'}

type hello struct {
	Version     uint16
	MaxTransfer uint32
}

func putHello(b []byte, h hello) {
	_ = b[helloSize-1]
	copy(b[0:4], helloMagic[:])
	binary.LittleEndian.PutUint16(b[4:], h.Version)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint32(b[8:], h.MaxTransfer)
	binary.LittleEndian.PutUint32(b[12:], 0)
}

// decodeHello parses a hello. A bad magic is a protocol error; another
// version is returned for the caller to judge.
func decodeHello(b []byte) (hello, error) {
	if len(b) < helloSize {
		return hello{}, fmt.Errorf("%w: short hello (%d bytes)", rdma.ErrProtocol, len(b))
	}
	if [4]byte(b[0:4]) != helloMagic {
		return hello{}, fmt.Errorf("%w: bad magic %q", rdma.ErrProtocol, b[0:4])
	}
	return hello{
		Version:     binary.LittleEndian.Uint16(b[4:]),
		MaxTransfer: binary.LittleEndian.Uint32(b[8:]),
	}, nil
}

// request is a decoded request header.
type request struct {
	Op      rdma.Opcode
	Length  uint32
	ID      uint64
	Key     rdma.Key
	Offset  uint64
	Compare uint64
	Operand uint64
}

func putRequest(b []byte, id uint64, wr *rdma.WorkRequest) {
	_ = b[reqSize-1]
	b[0] = version
	b[1] = byte(wr.Op)
	binary.LittleEndian.PutUint16(b[2:], 0)
	binary.LittleEndian.PutUint32(b[4:], uint32(wr.Len()))
	binary.LittleEndian.PutUint64(b[8:], id)
	copy(b[16:32], wr.Key[:])
	binary.LittleEndian.PutUint64(b[32:], wr.Offset)
	binary.LittleEndian.PutUint64(b[40:], wr.Compare)
	operand := wr.Swap
	if wr.Op == rdma.OpFetchAdd {
		operand = wr.Add
	}
	binary.LittleEndian.PutUint64(b[48:], operand)
}

// decodeRequest parses and validates a request header. Any error means the
// stream cannot be trusted any more: the server closes the connection.
// Semantic checks (key, bounds) are the Domain's, not the decoder's.
func decodeRequest(b []byte) (request, error) {
	if len(b) < reqSize {
		return request{}, fmt.Errorf("%w: short request header (%d bytes)", rdma.ErrProtocol, len(b))
	}
	if b[0] != version {
		return request{}, fmt.Errorf("%w: frame version %d, want %d", rdma.ErrVersion, b[0], version)
	}
	r := request{
		Op:      rdma.Opcode(b[1]),
		Length:  binary.LittleEndian.Uint32(b[4:]),
		ID:      binary.LittleEndian.Uint64(b[8:]),
		Key:     rdma.Key(b[16:32]),
		Offset:  binary.LittleEndian.Uint64(b[32:]),
		Compare: binary.LittleEndian.Uint64(b[40:]),
		Operand: binary.LittleEndian.Uint64(b[48:]),
	}
	if !r.Op.Valid() {
		return request{}, fmt.Errorf("%w: opcode %d", rdma.ErrProtocol, b[1])
	}
	if flags := binary.LittleEndian.Uint16(b[2:]); flags != 0 {
		return request{}, fmt.Errorf("%w: flags %#x", rdma.ErrProtocol, flags)
	}
	if r.Op.IsAtomic() {
		if r.Length != rdma.AtomicSize {
			return request{}, fmt.Errorf("%w: atomic length %d", rdma.ErrProtocol, r.Length)
		}
	} else if r.Length > rdma.MaxTransfer {
		return request{}, fmt.Errorf("%w: length %d > %d", rdma.ErrProtocol, r.Length, rdma.MaxTransfer)
	}
	return r, nil
}

// reply is a decoded reply header.
type reply struct {
	Op     rdma.Opcode
	Status rdma.Status
	Length uint32
	ID     uint64
	Value  uint64
}

func putReply(b []byte, r reply) {
	_ = b[replySize-1]
	b[0] = version
	b[1] = byte(r.Op)
	b[2] = byte(r.Status)
	b[3] = 0
	binary.LittleEndian.PutUint32(b[4:], r.Length)
	binary.LittleEndian.PutUint64(b[8:], r.ID)
	binary.LittleEndian.PutUint64(b[16:], r.Value)
}

// decodeReply parses a reply header and checks it against the request it
// answers (opcode, id, and for a READ the expected payload length).
func decodeReply(b []byte, id uint64, op rdma.Opcode, localLen int) (reply, error) {
	if len(b) < replySize {
		return reply{}, fmt.Errorf("%w: short reply header (%d bytes)", rdma.ErrProtocol, len(b))
	}
	if b[0] != version {
		return reply{}, fmt.Errorf("%w: frame version %d, want %d", rdma.ErrVersion, b[0], version)
	}
	r := reply{
		Op:     rdma.Opcode(b[1]),
		Status: rdma.Status(b[2]),
		Length: binary.LittleEndian.Uint32(b[4:]),
		ID:     binary.LittleEndian.Uint64(b[8:]),
		Value:  binary.LittleEndian.Uint64(b[16:]),
	}
	switch {
	case r.ID != id:
		return reply{}, fmt.Errorf("%w: reply id %d, want %d", rdma.ErrProtocol, r.ID, id)
	case r.Op != op:
		return reply{}, fmt.Errorf("%w: reply opcode %d, want %s", rdma.ErrProtocol, b[1], op)
	case !r.Status.Valid() || r.Status == rdma.StatusTransport:
		return reply{}, fmt.Errorf("%w: reply status %d", rdma.ErrProtocol, b[2])
	case b[3] != 0:
		return reply{}, fmt.Errorf("%w: reserved byte %#x", rdma.ErrProtocol, b[3])
	}
	want := uint32(0)
	if r.Status == rdma.StatusOK {
		want = uint32(localLen)
		if op.IsAtomic() {
			want = rdma.AtomicSize
		}
	}
	if r.Length != want {
		return reply{}, fmt.Errorf("%w: reply length %d, want %d", rdma.ErrProtocol, r.Length, want)
	}
	return r, nil
}
