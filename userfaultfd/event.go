package userfaultfd

import (
	"encoding/binary"
	"fmt"
	"math"
)

// MsgSize is the size of one struct uffd_msg.
const MsgSize = msgSizeUffdMsg

// Msg is one raw struct uffd_msg as read(2) returns it. A []Msg is the
// caller-owned buffer ReadEvents fills.
type Msg [MsgSize]byte

// Decode decodes m; see DecodeMsg.
func (m *Msg) Decode() (Event, error) { return DecodeMsg(m[:]) }

// Kind is m's event kind (its first byte), without decoding the rest.
func (m *Msg) Kind() EventKind { return EventKind(m[0]) }

// EventKind is the type of a userfaultfd message.
type EventKind uint8

// Event kinds (UFFD_EVENT_*).
const (
	EventPagefault EventKind = eventPagefault
	EventFork      EventKind = eventFork
	EventRemap     EventKind = eventRemap
	EventRemove    EventKind = eventRemove
	EventUnmap     EventKind = eventUnmap
)

func (k EventKind) String() string {
	switch k {
	case EventPagefault:
		return "PAGEFAULT"
	case EventFork:
		return "FORK"
	case EventRemap:
		return "REMAP"
	case EventRemove:
		return "REMOVE"
	case EventUnmap:
		return "UNMAP"
	}
	return fmt.Sprintf("EVENT(%#x)", uint8(k))
}

// FaultFlags describe a page fault (UFFD_PAGEFAULT_FLAG_*).
type FaultFlags uint64

const (
	// FaultWrite: the access was a write.
	FaultWrite FaultFlags = 1 << 0
	// FaultWP: a write hit a write-protected page (ModeWP).
	FaultWP FaultFlags = 1 << 1
	// FaultMinor: the page is in the page cache but not mapped (ModeMinor).
	FaultMinor FaultFlags = 1 << 2
)

// Event is a decoded userfaultfd message. Which fields are set depends on
// Kind:
//
//	EventPagefault: Addr (page aligned unless FeatureExactAddress), Flags,
//	                TID (with FeatureThreadID, else 0)
//	EventFork:      FD, the child's new userfaultfd, already installed in
//	                the reading process's fd table and owned by the caller
//	                (wrap it with FromFD using the parent's features)
//	EventRemap:     From, To, Len (mremap moved a registered range)
//	EventRemove:    Range (madvise DONTNEED/REMOVE dropped pages)
//	EventUnmap:     Range (munmap)
type Event struct {
	Kind  EventKind
	Addr  Addr
	Flags FaultFlags
	TID   uint32
	FD    int
	From  Addr
	To    Addr
	Len   uint64
	Range Range
}

// DecodeMsg decodes one struct uffd_msg. It is a pure function: it never
// panics, rejects buffers that are not exactly MsgSize bytes, unknown
// event kinds and inconsistent ranges with ErrBadMsg, and allocates only
// when it fails.
func DecodeMsg(b []byte) (Event, error) {
	if len(b) != MsgSize {
		return Event{}, fmt.Errorf("%w: %d bytes, want %d", ErrBadMsg, len(b), MsgSize)
	}
	bo := binary.NativeEndian // the kernel writes in host byte order
	ev := Event{Kind: EventKind(b[msgOffEvent])}
	a1 := bo.Uint64(b[msgOffArg:])
	a2 := bo.Uint64(b[msgOffArg2:])
	a3 := bo.Uint64(b[msgOffArg3:])
	switch ev.Kind {
	case EventPagefault:
		ev.Flags = FaultFlags(a1)
		ev.Addr = Addr(a2)
		ev.TID = bo.Uint32(b[msgOffArg3:])
	case EventFork:
		fd := bo.Uint32(b[msgOffArg:])
		if fd > math.MaxInt32 {
			return Event{}, fmt.Errorf("%w: fork fd %d", ErrBadMsg, fd)
		}
		ev.FD = int(fd)
	case EventRemap:
		ev.From, ev.To, ev.Len = Addr(a1), Addr(a2), a3
		if _, ok := ev.From.AddLength(a3); !ok {
			return Event{}, fmt.Errorf("%w: remap from %v len %d overflows", ErrBadMsg, ev.From, a3)
		}
		if _, ok := ev.To.AddLength(a3); !ok {
			return Event{}, fmt.Errorf("%w: remap to %v len %d overflows", ErrBadMsg, ev.To, a3)
		}
	case EventRemove, EventUnmap:
		r, ok := RangeFromTo(Addr(a1), Addr(a2))
		if !ok {
			return Event{}, fmt.Errorf("%w: %v range end %#x before start %#x", ErrBadMsg, ev.Kind, a2, a1)
		}
		ev.Range = r
	default:
		return Event{}, fmt.Errorf("%w: unknown event %#x", ErrBadMsg, b[msgOffEvent])
	}
	return ev, nil
}

// EncodeMsg is DecodeMsg's inverse: the struct uffd_msg the kernel would
// write for ev. It is for fakes of the kernel side (pager/pagertest) and
// for tests; the fields ev.Kind does not use are ignored.
func EncodeMsg(ev Event) Msg {
	var m Msg
	bo := binary.NativeEndian
	m[msgOffEvent] = byte(ev.Kind)
	switch ev.Kind {
	case EventPagefault:
		bo.PutUint64(m[msgOffArg:], uint64(ev.Flags))
		bo.PutUint64(m[msgOffArg2:], uint64(ev.Addr))
		bo.PutUint32(m[msgOffArg3:], ev.TID)
	case EventFork:
		bo.PutUint32(m[msgOffArg:], uint32(ev.FD))
	case EventRemap:
		bo.PutUint64(m[msgOffArg:], uint64(ev.From))
		bo.PutUint64(m[msgOffArg2:], uint64(ev.To))
		bo.PutUint64(m[msgOffArg3:], ev.Len)
	case EventRemove, EventUnmap:
		bo.PutUint64(m[msgOffArg:], uint64(ev.Range.Start))
		bo.PutUint64(m[msgOffArg2:], uint64(ev.Range.Start)+ev.Range.Len)
	}
	return m
}
