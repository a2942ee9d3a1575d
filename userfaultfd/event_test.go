package userfaultfd

import (
	"encoding/binary"
	"errors"
	"testing"
)

func rawMsg(kind byte, a1, a2, a3 uint64) []byte {
	b := make([]byte, MsgSize)
	b[0] = kind
	binary.NativeEndian.PutUint64(b[8:], a1)
	binary.NativeEndian.PutUint64(b[16:], a2)
	binary.NativeEndian.PutUint64(b[24:], a3)
	return b
}

func TestDecodeMsg(t *testing.T) {
	ev, err := DecodeMsg(rawMsg(eventPagefault, uint64(FaultWrite|FaultWP), 0x7f0000001000, 4242))
	if err != nil || ev.Kind != EventPagefault || ev.Addr != 0x7f0000001000 || ev.Flags != FaultWrite|FaultWP || ev.TID != 4242 {
		t.Errorf("pagefault: %+v %v", ev, err)
	}
	ev, err = DecodeMsg(rawMsg(eventFork, 17, 0, 0))
	if err != nil || ev.Kind != EventFork || ev.FD != 17 {
		t.Errorf("fork: %+v %v", ev, err)
	}
	ev, err = DecodeMsg(rawMsg(eventRemap, 0x1000, 0x9000, 0x2000))
	if err != nil || ev.From != 0x1000 || ev.To != 0x9000 || ev.Len != 0x2000 {
		t.Errorf("remap: %+v %v", ev, err)
	}
	for _, k := range []byte{eventRemove, eventUnmap} {
		ev, err = DecodeMsg(rawMsg(k, 0x4000, 0x6000, 0))
		if err != nil || ev.Kind != EventKind(k) || ev.Range != (Range{0x4000, 0x2000}) {
			t.Errorf("%v: %+v %v", EventKind(k), ev, err)
		}
	}
	for name, b := range map[string][]byte{
		"short":          make([]byte, 31),
		"long":           make([]byte, 33),
		"unknown kind":   rawMsg(0x11, 0, 0, 0),
		"zero kind":      rawMsg(0, 0, 0, 0),
		"remove reverse": rawMsg(eventRemove, 0x6000, 0x4000, 0),
		"remap wraps":    rawMsg(eventRemap, ^uint64(0), 0, 2),
		"fork fd huge":   rawMsg(eventFork, 1<<31, 0, 0),
	} {
		if _, err := DecodeMsg(b); !errors.Is(err, ErrBadMsg) {
			t.Errorf("%s: err = %v, want ErrBadMsg", name, err)
		}
	}
}

func TestDecodeMsgAllocs(t *testing.T) {
	var m Msg
	copy(m[:], rawMsg(eventPagefault, 1, 0x1000, 0))
	if n := testing.AllocsPerRun(100, func() { _, _ = m.Decode() }); n != 0 {
		t.Errorf("Decode allocates %v times", n)
	}
}

// FuzzDecodeMsg checks invariants, not outputs: DecodeMsg never panics, and
// whatever it accepts is self-consistent.
func FuzzDecodeMsg(f *testing.F) {
	f.Add(rawMsg(eventPagefault, 3, 0x7f0000001000, 99))
	f.Add(rawMsg(eventFork, 5, 0, 0))
	f.Add(rawMsg(eventRemap, 0x1000, 0x2000, 0x1000))
	f.Add(rawMsg(eventRemove, 0x1000, 0x3000, 0))
	f.Add(rawMsg(eventUnmap, 0x3000, 0x1000, 0))
	f.Add(rawMsg(eventRemap, ^uint64(0)-5, 0, 8))
	f.Add([]byte{eventPagefault})
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := DecodeMsg(b)
		if err != nil {
			if !errors.Is(err, ErrBadMsg) {
				t.Fatalf("error %v does not wrap ErrBadMsg", err)
			}
			if ev != (Event{}) {
				t.Fatalf("error with non-zero event %+v", ev)
			}
			return
		}
		if len(b) != MsgSize {
			t.Fatalf("accepted %d bytes", len(b))
		}
		if EventKind(b[0]) != ev.Kind {
			t.Fatalf("kind %v from byte %#x", ev.Kind, b[0])
		}
		switch ev.Kind {
		case EventPagefault:
			if uint64(ev.Addr) != binary.NativeEndian.Uint64(b[16:]) {
				t.Fatal("address mismatch")
			}
		case EventFork:
			if ev.FD < 0 {
				t.Fatalf("negative fd %d", ev.FD)
			}
		case EventRemap:
			if _, ok := ev.From.AddLength(ev.Len); !ok {
				t.Fatal("accepted wrapping remap source")
			}
			if _, ok := ev.To.AddLength(ev.Len); !ok {
				t.Fatal("accepted wrapping remap target")
			}
		case EventRemove, EventUnmap:
			end, ok := ev.Range.End()
			if !ok || uint64(end) != binary.NativeEndian.Uint64(b[16:]) {
				t.Fatalf("range %v inconsistent", ev.Range)
			}
		default:
			t.Fatalf("accepted unknown kind %v", ev.Kind)
		}
	})
}

func TestEncodeMsgRoundTrip(t *testing.T) {
	for _, ev := range []Event{
		{Kind: EventPagefault, Addr: 0x7f0000003000, Flags: FaultWrite | FaultWP, TID: 77},
		{Kind: EventFork, FD: 12},
		{Kind: EventRemap, From: 0x1000, To: 0x9000, Len: 0x3000},
		{Kind: EventRemove, Range: Range{Start: 0x4000, Len: 0x2000}},
		{Kind: EventUnmap, Range: Range{Start: 0x8000, Len: 0x1000}},
	} {
		m := EncodeMsg(ev)
		got, err := m.Decode()
		if err != nil || got != ev {
			t.Errorf("%v: decoded %+v, %v; want %+v", ev.Kind, got, err, ev)
		}
	}
}
