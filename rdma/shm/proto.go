package shm

import (
	"encoding/binary"
	"fmt"

	"rmem/rdma"
)

// Control protocol, version 1, over a SOCK_SEQPACKET unix socket (one
// message per packet, little endian).
//
//	client hello (8):   "RMSH" version u16 reserved u16
//	server hello (16):  "RMSH" version u16 reserved u16 ctlSize u32 reserved u32
//	                    + SCM_RIGHTS: the connection's control memfd
//	request (24):       op u8 (1 MAP, 2 UNMAP) reserved [3] slot u32 key [16]
//	map reply (32):     status u8 access u8 reserved [2] slot u32
//	                    offset u64 length u64 reserved u64
//	                    + SCM_RIGHTS: the region's memfd when status is OK
//
// UNMAP has no reply. The control memfd holds the connection word and the
// key slots (see doc.go).
const (
	version      = 1
	helloSize    = 8
	srvHelloSize = 16
	reqSize      = 24
	replySize    = 32

	opMap   = 1
	opUnmap = 2

	// ctlSize is the control memfd: a 64-byte header (word 0: connection
	// state) and 16-byte slots (state u32, inflight u32, reserved u64).
	ctlSize   = 64 << 10
	ctlHeader = 64
	slotSize  = 16
	numSlots  = (ctlSize - ctlHeader) / slotSize

	connLive   = 0
	connClosed = 1

	slotFree    = 0
	slotValid   = 1
	slotRevoked = 2
)

var magic = [4]byte{'R', 'M', 'S', 'H'}

func slotOff(slot int) int { return ctlHeader + slot*slotSize }

type request struct {
	Op   uint8
	Slot uint32
	Key  rdma.Key
}

func putRequest(b []byte, r request) {
	_ = b[reqSize-1]
	b[0] = r.Op
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], r.Slot)
	copy(b[8:24], r.Key[:])
}

func decodeRequest(b []byte) (request, error) {
	if len(b) != reqSize {
		return request{}, fmt.Errorf("%w: request of %d bytes", rdma.ErrProtocol, len(b))
	}
	r := request{Op: b[0], Slot: binary.LittleEndian.Uint32(b[4:]), Key: rdma.Key(b[8:24])}
	if r.Op != opMap && r.Op != opUnmap {
		return request{}, fmt.Errorf("%w: op %d", rdma.ErrProtocol, b[0])
	}
	if b[1]|b[2]|b[3] != 0 {
		return request{}, fmt.Errorf("%w: reserved bytes set", rdma.ErrProtocol)
	}
	if r.Op == opUnmap && r.Slot >= numSlots {
		return request{}, fmt.Errorf("%w: slot %d", rdma.ErrProtocol, r.Slot)
	}
	return r, nil
}

type mapReply struct {
	Status rdma.Status
	Access rdma.Access
	Slot   uint32
	Offset uint64
	Length uint64
}

func putMapReply(b []byte, r mapReply) {
	_ = b[replySize-1]
	clear(b[:replySize])
	b[0] = byte(r.Status)
	b[1] = byte(r.Access)
	binary.LittleEndian.PutUint32(b[4:], r.Slot)
	binary.LittleEndian.PutUint64(b[8:], r.Offset)
	binary.LittleEndian.PutUint64(b[16:], r.Length)
}

// decodeMapReply parses a MAP reply; an OK reply must describe a sane
// mapping (a valid slot and access, a non-empty range that does not wrap).
func decodeMapReply(b []byte) (mapReply, error) {
	if len(b) != replySize {
		return mapReply{}, fmt.Errorf("%w: map reply of %d bytes", rdma.ErrProtocol, len(b))
	}
	r := mapReply{
		Status: rdma.Status(b[0]), Access: rdma.Access(b[1]),
		Slot:   binary.LittleEndian.Uint32(b[4:]),
		Offset: binary.LittleEndian.Uint64(b[8:]),
		Length: binary.LittleEndian.Uint64(b[16:]),
	}
	if !r.Status.Valid() || r.Status == rdma.StatusTransport {
		return mapReply{}, fmt.Errorf("%w: map status %d", rdma.ErrProtocol, b[0])
	}
	if r.Status != rdma.StatusOK {
		return r, nil
	}
	if !r.Access.Valid() || r.Slot >= numSlots || r.Length == 0 || r.Length > 1<<47 || r.Offset > 1<<47 {
		return mapReply{}, fmt.Errorf("%w: bad mapping %+v", rdma.ErrProtocol, r)
	}
	return r, nil
}

func putHello(b []byte) {
	copy(b[0:4], magic[:])
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint16(b[6:], 0)
}

// decodeHello checks a hello's magic and returns its version.
func decodeHello(b []byte) (uint16, error) {
	if len(b) < helloSize || [4]byte(b[0:4]) != magic {
		return 0, fmt.Errorf("%w: bad hello", rdma.ErrProtocol)
	}
	return binary.LittleEndian.Uint16(b[4:]), nil
}
