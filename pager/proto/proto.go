package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Wire constants (mirrored in preload/proto.h).
const (
	// Magic is "RMEM" read as a little-endian u32.
	Magic uint32 = 'R' | 'M'<<8 | 'E'<<16 | 'M'<<24
	// Version is the protocol version this package speaks.
	Version uint16 = 2
	// HeaderSize is the size of the header that starts every packet.
	HeaderSize = 16
	// MaxEvictBatch is the most pages one EVICT names (and the most the
	// agent evicts in one batch).
	MaxEvictBatch = 128
	// NoSlot as an EVICT entry's slot: drop the page without copying it
	// (the pool holds its contents, or nothing is mapped there).
	NoSlot = ^uint32(0)
	// MaxErrorText is the longest text an ERROR carries, in bytes.
	MaxErrorText = 200
	// MaxBody is the largest body of any message (a full EVICT).
	MaxBody = evictFixed + MaxEvictBatch*evictEntry
	// MaxPacket is the largest packet; a receive buffer of this size
	// never truncates a valid message.
	MaxPacket = HeaderSize + MaxBody
	// MaxFDs is the most descriptors one message carries (WELCOME to a
	// child forked with a FORK event whose faults come through the ring:
	// the staging memfd, its uffd and its doorbell).
	MaxFDs = 3
	// MaxStagingSlots bounds WELCOME's staging area (256 MiB of 4 KiB
	// pages).
	MaxStagingSlots = 1 << 16
)

// Sockets and environment.
const (
	// DefaultSocket is where memagent listens unless configured
	// otherwise.
	DefaultSocket = "/run/rmem/memagent.sock"
	// EnvSocket overrides DefaultSocket for the shim and the Go client.
	EnvSocket = "RMEM_AGENT_SOCK"
	// EnvLocalMem is the resident-memory budget the shim asks for in
	// HELLO (bytes, or with a K/M/G, KiB/MiB/GiB suffix); unset: the
	// agent's default. memagent run sets it from --local-mem.
	EnvLocalMem = "RMEM_LOCAL_MEM"
	// EnvMaxSlowdown is the paging stall the shim asks the agent to steer
	// its budget by, in HELLO (millionths of wall time: 20000 is 2%);
	// unset: the agent's default. memagent run sets it from
	// --max-slowdown.
	EnvMaxSlowdown = "RMEM_MAX_SLOWDOWN"
	// EnvInThread, "1", has the shim take its page faults in the faulting
	// thread, through the fault ring (HelloRing), instead of in the
	// kernel: memagent run --in-thread sets it.
	EnvInThread = "RMEM_IN_THREAD"
	// EnvMinAlloc sets the shim's threshold (bytes, or with a K/M/G,
	// KiB/MiB/GiB suffix); it wins over WELCOME's MinAlloc.
	EnvMinAlloc = "RMEM_MIN_ALLOC"
	// DefaultMinAlloc is the shim's threshold for direct mmaps (and sbrk)
	// when neither RMEM_MIN_ALLOC nor the agent says otherwise: 64 KiB,
	// the pieces allocators that map their own memory map. It does not
	// concern malloc, which the shim pages whole in glibc mode (see
	// preload/src/rmem.h).
	DefaultMinAlloc = 64 << 10
)

// EnvAgentWait is how long a client whose agent went away waits for an
// agent to resume it (a duration: "60s", or seconds), reconnecting; when
// a fault of it has waited that long the process gets SIGBUS. Unset:
// DefaultAgentWait.
const EnvAgentWait = "RMEM_AGENT_WAIT"

// EnvUFFDUserMode, set to 1, makes the shim take a uffd for faults from
// user mode only (UFFD_USER_MODE_ONLY), which any user may create, when
// it may have no other: the kernel's own accesses to missing pages
// (read(2) into a paged buffer) then fail with EFAULT instead of waiting
// for the page, so it is for test programs that touch their memory only
// from their own code (the pager's tests without root), never for real
// programs. The Go client's equivalent is client.Options.UserModeOnly.
const EnvUFFDUserMode = "RMEM_UFFD_USER_MODE"

// DefaultAgentWait is EnvAgentWait's default.
const DefaultAgentWait = 60 * time.Second

// AgentWait returns $RMEM_AGENT_WAIT, or DefaultAgentWait when it is unset
// or not a positive duration.
func AgentWait() time.Duration {
	v := os.Getenv(EnvAgentWait)
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return DefaultAgentWait
}

// SocketPath returns the agent socket a client should use: $RMEM_AGENT_SOCK
// if set, else DefaultSocket.
func SocketPath() string {
	if p := os.Getenv(EnvSocket); p != "" {
		return p
	}
	return DefaultSocket
}

// Errors. Every decoding error wraps one of these.
var (
	// ErrMalformed: the bytes are not a well-formed message.
	ErrMalformed = errors.New("proto: malformed message")
	// ErrVersion: the peer speaks another protocol version.
	ErrVersion = errors.New("proto: unsupported version")
	// ErrType: the message type is unknown or not the one expected.
	ErrType = errors.New("proto: unexpected message type")
	// ErrTruncated: a packet or its descriptors did not fit the buffers.
	ErrTruncated = errors.New("proto: truncated packet")
)

// Type is a message type.
type Type uint16

// Message types; the table in docs/pager.md says who sends each.
const (
	TypeHello       Type = 1  // shim → agent, first message; fd: the uffd (top-level processes)
	TypeWelcome     Type = 2  // agent → shim, reply to HELLO; fds: staging memfd [, child's uffd]
	TypeRegionAdd   Type = 3  // shim → agent, a registered region; reply ACK or ERROR
	TypeRegionDel   Type = 4  // shim → agent, part or all of a region goes away; reply ACK or ERROR
	TypeAck         Type = 5  // reply: request done
	TypeError       Type = 6  // reply: request failed (errno, text)
	TypeEvict       Type = 7  // agent → shim helper thread: copy pages to staging slots, drop them
	TypeEvicted     Type = 8  // shim → agent, reply to EVICT
	TypeRegionZap   Type = 9  // shim → agent, part of a region is being dropped (MADV_DONTNEED): it reads as zeros; reply ACK or ERROR
	TypeUFFDDevice  Type = 10 // shim → agent, before HELLO: lend me /dev/userfaultfd; reply ACK with the descriptor, or ERROR
	TypeForkPrepare Type = 11 // shim → agent, before fork(2) without FORK events: copy my pooled pages for the child; reply ACK or ERROR
	TypeForkDone    Type = 12 // shim → agent, after that fork(2) returned in the parent; no reply
	TypeResumeDone  Type = 13 // shim → agent, after a resuming HELLO's REGION_ADDs; reply ACK or ERROR
	TypeHandoff     Type = 14 // shim → agent, before descriptors leave its sight (exec, SCM_RIGHTS); reply ACK or ERROR
	typeMax              = TypeHandoff
)

var typeNames = [...]string{"", "HELLO", "WELCOME", "REGION_ADD", "REGION_DEL", "ACK", "ERROR", "EVICT", "EVICTED", "REGION_ZAP", "UFFD_DEVICE", "FORK_PREPARE", "FORK_DONE", "RESUME_DONE", "HANDOFF"}

func (t Type) String() string {
	if t >= 1 && t <= typeMax {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint16(t))
}

// Header is the decoded packet header (magic and version are checked,
// not kept).
type Header struct {
	Type Type
	Seq  uint32 // sender's sequence number; replies name it in Ack.Seq / Error.Seq
	Len  uint32 // body length
}

var le = binary.LittleEndian

func appendHeader(b []byte, t Type, seq uint32, bodyLen int) []byte {
	b = le.AppendUint32(b, Magic)
	b = le.AppendUint16(b, Version)
	b = le.AppendUint16(b, uint16(t))
	b = le.AppendUint32(b, seq)
	return le.AppendUint32(b, uint32(bodyLen))
}

// Parse checks pkt's header and returns it with the body. The body's
// length must be exactly the header's Len (one packet, one message).
func Parse(pkt []byte) (Header, []byte, error) {
	if len(pkt) < HeaderSize {
		return Header{}, nil, fmt.Errorf("%w: %d-byte packet is shorter than the %d-byte header", ErrMalformed, len(pkt), HeaderSize)
	}
	if m := le.Uint32(pkt); m != Magic {
		return Header{}, nil, fmt.Errorf("%w: bad magic %#08x", ErrMalformed, m)
	}
	if v := le.Uint16(pkt[4:]); v != Version {
		return Header{}, nil, fmt.Errorf("%w: version %d, want %d", ErrVersion, v, Version)
	}
	h := Header{Type: Type(le.Uint16(pkt[6:])), Seq: le.Uint32(pkt[8:]), Len: le.Uint32(pkt[12:])}
	if h.Type < 1 || h.Type > typeMax {
		return Header{}, nil, fmt.Errorf("%w: unknown %v", ErrType, h.Type)
	}
	if h.Len > MaxBody {
		return Header{}, nil, fmt.Errorf("%w: %v body of %d bytes exceeds %d", ErrMalformed, h.Type, h.Len, MaxBody)
	}
	if uint64(h.Len) != uint64(len(pkt)-HeaderSize) {
		return Header{}, nil, fmt.Errorf("%w: %v header says %d body bytes, packet has %d", ErrMalformed, h.Type, h.Len, len(pkt)-HeaderSize)
	}
	return h, pkt[HeaderSize:], nil
}

// Message is any message body.
type Message interface {
	// Type is the message's type.
	Type() Type
	// Encode appends the whole packet (header with seq, then body) to b.
	Encode(b []byte, seq uint32) []byte
	// Decode sets the message from a body (as Parse returns it).
	Decode(body []byte) error
}

// New returns a zero message of type t, or nil if t is unknown.
func New(t Type) Message {
	switch t {
	case TypeHello:
		return new(Hello)
	case TypeWelcome:
		return new(Welcome)
	case TypeRegionAdd:
		return new(RegionAdd)
	case TypeRegionDel:
		return new(RegionDel)
	case TypeAck:
		return new(Ack)
	case TypeError:
		return new(Error)
	case TypeEvict:
		return new(Evict)
	case TypeEvicted:
		return new(Evicted)
	case TypeRegionZap:
		return new(RegionZap)
	case TypeUFFDDevice:
		return new(UFFDDevice)
	case TypeForkPrepare:
		return new(ForkPrepare)
	case TypeForkDone:
		return new(ForkDone)
	case TypeResumeDone:
		return new(ResumeDone)
	case TypeHandoff:
		return new(Handoff)
	}
	return nil
}

// Decode parses a whole packet into its header and a newly allocated
// message. Hot paths use Parse and the message types' Decode instead.
func Decode(pkt []byte) (Header, Message, error) {
	h, body, err := Parse(pkt)
	if err != nil {
		return Header{}, nil, err
	}
	m := New(h.Type)
	if err := m.Decode(body); err != nil {
		return Header{}, nil, err
	}
	return h, m, nil
}

// Expect parses pkt and decodes it into m if it has m's type; otherwise
// (or if it does not decode) it returns an error wrapping ErrType or
// ErrMalformed. An ERROR packet received where m was expected is returned
// as that *Error (it wraps the peer's errno), so callers see why.
func Expect(pkt []byte, m Message) (Header, error) {
	h, body, err := Parse(pkt)
	if err != nil {
		return Header{}, err
	}
	if h.Type != m.Type() {
		if h.Type == TypeError && m.Type() != TypeError {
			var e Error
			if err := e.Decode(body); err != nil {
				return Header{}, err
			}
			return h, &e
		}
		return Header{}, fmt.Errorf("%w: got %v, want %v", ErrType, h.Type, m.Type())
	}
	return h, m.Decode(body)
}

func checkLen(t Type, body []byte, want int) error {
	if len(body) != want {
		return fmt.Errorf("%w: %v body is %d bytes, want %d", ErrMalformed, t, len(body), want)
	}
	return nil
}

func reserved(t Type, field string, v uint32) error {
	if v != 0 {
		return fmt.Errorf("%w: %v %s is %#x, must be 0", ErrMalformed, t, field, v)
	}
	return nil
}
