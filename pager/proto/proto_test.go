package proto

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

func sampleMessages() []Message {
	ev := &Evict{Batch: 7, N: 3}
	ev.Pages[0] = EvictPage{Addr: 0x7f0000000000, Slot: 0}
	ev.Pages[1] = EvictPage{Addr: 0x7f0000001000, Slot: 1}
	ev.Pages[2] = EvictPage{Addr: 0x7f0000009000, Slot: 63}
	full := &Evict{Batch: 1 << 60, N: MaxEvictBatch}
	for i := range full.Pages {
		full.Pages[i] = EvictPage{Addr: userfaultfd.Addr(0x1000 * (i + 1)), Slot: uint32(i)}
	}
	return []Message{
		&Hello{PID: 42, PPID: 1, Features: userfaultfd.FeatureEventFork | userfaultfd.FeaturePagefaultFlagWP, PageSize: 4096, Flags: HelloUFFD},
		&Hello{PID: 43, PPID: 42, ForkSerial: 2, PageSize: 4096, LocalMem: 512 << 20},
		&Hello{PID: 43, PPID: 42, ForkSerial: 3, PageSize: 4096},
		&Hello{PID: 44, PPID: 42, ForkSerial: 4, PageSize: 4096, Flags: HelloUFFD},
		&Hello{PID: 45, PPID: 1, PageSize: 4096, Flags: HelloUFFD | HelloResume},
		&Hello{PID: 46, PPID: 1, PageSize: 4096, Flags: HelloUFFD | HelloTraced, LocalMem: 64 << 20},
		&Hello{PID: 47, PPID: 46, ForkSerial: 1, PageSize: 4096, Flags: HelloUFFD | HelloTraced},
		&ResumeDone{Regions: 17},
		&Handoff{PID: 42, Flags: HandoffExec},
		&Handoff{PID: 43, N: 2, FDs: [HandoffMaxFDs]int32{7, 0}},
		&Handoff{PID: 43, Flags: HandoffIO, N: 1, FDs: [HandoffMaxFDs]int32{9}},
		&Handoff{PID: 44, N: HandoffMaxFDs, FDs: [HandoffMaxFDs]int32{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 1 << 20}},
		&UFFDDevice{},
		&ForkPrepare{Serial: 1},
		&ForkDone{Serial: 1, PID: 4242},
		&ForkDone{Serial: 1 << 40, PID: -int32(unix.EAGAIN)},
		&ForkDone{Serial: 2}, // pid not known (a fork inside the C library)
		&Welcome{ClientID: 9, MinAlloc: 1 << 20, StagingSlots: 256},
		&Welcome{ClientID: 10, StagingSlots: 1, Flags: WelcomeUFFD},
		&Welcome{ClientID: 11, StagingSlots: 256, Flags: WelcomeResumed},
		&RegionAdd{ID: 5, Range: userfaultfd.Range{Start: 0x7f1234560000, Len: 1 << 30}, Kind: KindHeap},
		&RegionAdd{ID: 6, Range: userfaultfd.Range{Start: 0x1000, Len: 4096}, Kind: KindMmap},
		&RegionAdd{ID: 7, Range: userfaultfd.Range{Start: 0x2000, Len: 1 << 20}, Kind: KindShared},
		&RegionAdd{ID: 7, Range: userfaultfd.Range{Start: 0x2000, Len: 4096}, Kind: KindHeap, Flags: RegionResumed},
		&RegionAdd{ID: 8, Range: userfaultfd.Range{Start: 0x3000, Len: 4096}, Kind: KindShared, Flags: RegionUnpaged},
		&RegionDel{ID: 5, Range: userfaultfd.Range{Start: 0x7f1234560000, Len: 1 << 30}},
		&RegionZap{ID: 5, Range: userfaultfd.Range{Start: 0x7f1234561000, Len: 3 << 12}},
		&Ack{Seq: 77},
		&Error{Seq: 78, Errno: unix.ENOMEM, Text: "over budget"},
		&Error{Seq: 79, Errno: unix.EINVAL},
		ev,
		full,
		&Evicted{Batch: 7, Done: 3},
		&Evicted{Batch: 8, Done: 1, Errno: unix.EFAULT},
	}
}

func TestRoundTrip(t *testing.T) {
	buf := make([]byte, 0, MaxPacket)
	for _, m := range sampleMessages() {
		t.Run(m.Type().String(), func(t *testing.T) {
			pkt := m.Encode(buf[:0], 1234)
			if len(pkt) > MaxPacket {
				t.Fatalf("packet of %d bytes exceeds MaxPacket %d", len(pkt), MaxPacket)
			}
			h, got, err := Decode(pkt)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if h.Type != m.Type() || h.Seq != 1234 || int(h.Len) != len(pkt)-HeaderSize {
				t.Fatalf("header %+v", h)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("decoded %+v, want %+v", got, m)
			}
			if again := got.Encode(nil, 1234); !bytes.Equal(again, pkt) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, pkt)
			}
		})
	}
}

func TestEncodeDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, MaxPacket)
	for _, m := range sampleMessages() {
		if a := testing.AllocsPerRun(100, func() { _ = m.Encode(buf[:0], 1) }); a != 0 {
			t.Errorf("%v.Encode allocates %v times", m.Type(), a)
		}
	}
	var pkt []byte
	for _, m := range sampleMessages() {
		if e, ok := m.(*Evict); ok && e.N > 1 {
			pkt = m.Encode(buf[:0], 1)
		}
	}
	var ev Evict
	if a := testing.AllocsPerRun(100, func() {
		_, body, _ := Parse(pkt)
		_ = ev.Decode(body)
	}); a != 0 {
		t.Errorf("Parse+Evict.Decode allocates %v times", a)
	}
}

func TestWireLayout(t *testing.T) {
	// The first bytes of every packet, as preload/proto.h writes them.
	pkt := (&Ack{Seq: 0x01020304}).Encode(nil, 0x0a0b0c0d)
	want := []byte{'R', 'M', 'E', 'M', 2, 0, 5, 0, 0x0d, 0x0c, 0x0b, 0x0a, 8, 0, 0, 0, 4, 3, 2, 1, 0, 0, 0, 0}
	if !bytes.Equal(pkt, want) {
		t.Fatalf("ACK packet\n got %x\nwant %x", pkt, want)
	}
	sizes := map[Type]int{TypeHello: helloSize, TypeWelcome: welcomeSize, TypeRegionAdd: regionAddSize,
		TypeRegionDel: regionDelSize, TypeAck: ackSize, TypeEvicted: evictedSize, TypeRegionZap: regionDelSize}
	for _, m := range sampleMessages() {
		if want, ok := sizes[m.Type()]; ok {
			if got := len(m.Encode(nil, 0)) - HeaderSize; got != want {
				t.Errorf("%v body is %d bytes, want %d", m.Type(), got, want)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	good := (&RegionDel{ID: 1, Range: userfaultfd.Range{Start: 0x1000, Len: 0x1000}}).Encode(nil, 1)
	patch := func(off int, b ...byte) []byte {
		p := bytes.Clone(good)
		copy(p[off:], b)
		return p
	}
	hello := func(edit func(h *Hello)) []byte {
		h := Hello{PID: 1, PPID: 0, PageSize: 4096, Flags: HelloUFFD}
		edit(&h)
		return h.Encode(nil, 0)
	}
	evict := func(n uint32) []byte {
		p := (&Evict{N: 1}).Encode(nil, 0)
		le.PutUint32(p[HeaderSize+8:], n)
		return p
	}
	errPkt := func(errno unix.Errno, text string) []byte {
		p := appendHeader(nil, TypeError, 0, errorFixed+len(text))
		p = le.AppendUint32(p, 1)
		p = le.AppendUint32(p, uint32(errno))
		return append(p, text...)
	}
	cases := []struct {
		name string
		pkt  []byte
		want error
		text string
	}{
		{"empty", nil, ErrMalformed, "shorter than"},
		{"short header", good[:10], ErrMalformed, "shorter than"},
		{"wrong magic", patch(0, 'X'), ErrMalformed, "magic"},
		{"wrong version", patch(4, 1), ErrVersion, "version 1"},
		{"type zero", patch(6, 0), ErrType, "type(0)"},
		{"unknown type", patch(6, 99), ErrType, "type(99)"},
		{"oversize len", patch(12, 0xff, 0xff, 0xff, 0x7f), ErrMalformed, "exceeds"},
		{"len beyond packet", patch(12, 25), ErrMalformed, "header says 25"},
		{"short body", good[:len(good)-1], ErrMalformed, "header says"},
		{"body length for type", patch(6, byte(TypeAck)), ErrMalformed, "want 8"},
		{"empty range", patch(HeaderSize+16, 0, 0, 0, 0, 0, 0, 0, 0), ErrMalformed, "range"},
		{"wrapping range", patch(HeaderSize+16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), ErrMalformed, "range"},
		{"hello pid", hello(func(h *Hello) { h.PID = 0 }), ErrMalformed, "pid"},
		{"hello page size", hello(func(h *Hello) { h.PageSize = 5000 }), ErrMalformed, "page size"},
		{"hello top-level without uffd", hello(func(h *Hello) { h.Flags = 0 }), ErrMalformed, "without its uffd"},
		{"hello resume without uffd", hello(func(h *Hello) { h.Flags, h.ForkSerial = HelloResume, 1 }), ErrMalformed, "resuming HELLO"},
		{"hello traced without uffd", hello(func(h *Hello) { h.Flags, h.ForkSerial = HelloTraced, 1 }), ErrMalformed, "traced HELLO"},
		{"hello traced resume", hello(func(h *Hello) { h.Flags |= HelloTraced | HelloResume }), ErrMalformed, "traced HELLO"},
		{"hello traced shared", hello(func(h *Hello) { h.Flags |= HelloTraced | HelloShared }), ErrMalformed, "traced HELLO"},
		{"hello unknown flag", hello(func(h *Hello) { h.Flags = HelloUFFD | 1<<7 }), ErrMalformed, "flags 0x81"},
		{"region flags", (&RegionAdd{ID: 1, Range: userfaultfd.Range{Start: 0, Len: 1}, Kind: KindHeap, Flags: 4}).Encode(nil, 0), ErrMalformed, "flags 0x4"},
		{"unpaged heap", (&RegionAdd{ID: 1, Range: userfaultfd.Range{Start: 0, Len: 1}, Kind: KindHeap, Flags: RegionUnpaged}).Encode(nil, 0), ErrMalformed, "unpaged"},
		{"unpaged resumed", (&RegionAdd{ID: 1, Range: userfaultfd.Range{Start: 0, Len: 1}, Kind: KindShared, Flags: RegionUnpaged | RegionResumed}).Encode(nil, 0), ErrMalformed, "unpaged"},
		{"resume done reserved", append((&ResumeDone{Regions: 1}).Encode(nil, 0)[:HeaderSize+4], 1, 0, 0, 0), ErrMalformed, "must be 0"},
		{"handoff pid", (&Handoff{}).Encode(nil, 0), ErrMalformed, "pid 0"},
		{"handoff flags", (&Handoff{PID: 1, Flags: 4}).Encode(nil, 0), ErrMalformed, "flags 0x4"},
		{"handoff exec and io", (&Handoff{PID: 1, Flags: HandoffExec | HandoffIO}).Encode(nil, 0), ErrMalformed, "flags 0x3"},
		{"handoff count", (&Handoff{PID: 1, N: HandoffMaxFDs + 1}).Encode(nil, 0), ErrMalformed, "17 descriptors"},
		{"handoff negative fd", (&Handoff{PID: 1, N: 1, FDs: [HandoffMaxFDs]int32{-1}}).Encode(nil, 0), ErrMalformed, "descriptor -1"},
		{"handoff fd past count", (&Handoff{PID: 1, N: 1, FDs: [HandoffMaxFDs]int32{3, 4}}).Encode(nil, 0), ErrMalformed, "must be 0"},
		{"handoff reserved", append((&Handoff{PID: 1}).Encode(nil, 0)[:HeaderSize+12], append([]byte{1, 0, 0, 0}, make([]byte, 4*HandoffMaxFDs)...)...), ErrMalformed, "must be 0"},
		{"uffd device body", append(appendHeader(nil, TypeUFFDDevice, 0, 1), 0), ErrMalformed, "want 0"},
		{"fork prepare serial 0", (&ForkPrepare{}).Encode(nil, 0), ErrMalformed, "serial 0"},
		{"fork prepare reserved", append((&ForkPrepare{Serial: 1}).Encode(nil, 0)[:HeaderSize+8], 1, 0, 0, 0, 0, 0, 0, 0), ErrMalformed, "must be 0"},
		{"fork done reserved", append((&ForkDone{Serial: 1, PID: 5}).Encode(nil, 0)[:HeaderSize+12], 1, 0, 0, 0), ErrMalformed, "must be 0"},
		{"welcome no slots", (&Welcome{}).Encode(nil, 0), ErrMalformed, "staging slots"},
		{"region kind", (&RegionAdd{ID: 1, Range: userfaultfd.Range{Start: 0, Len: 1}, Kind: 4}).Encode(nil, 0), ErrMalformed, "kind(4)"},
		{"evict none", evict(0), ErrMalformed, "0 pages"},
		{"evict too many", evict(MaxEvictBatch + 1), ErrMalformed, "129 pages"},
		{"evict count beyond body", evict(2), ErrMalformed, "want 48"},
		{"error errno 0", errPkt(0, "x"), ErrMalformed, "errno 0"},
		{"error text too long", errPkt(unix.EIO, strings.Repeat("x", MaxErrorText+1)), ErrMalformed, "want 8..208"},
		{"evicted done", (&Evicted{Done: MaxEvictBatch + 1}).Encode(nil, 0), ErrMalformed, "129 pages done"},
		{"ack reserved", append(appendHeader(nil, TypeAck, 0, 8), 1, 0, 0, 0, 1, 0, 0, 0), ErrMalformed, "must be 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Decode(c.pkt)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) || !strings.HasPrefix(err.Error(), "proto: ") {
				t.Fatalf("Decode = %v, want %v containing %q", err, c.want, c.text)
			}
		})
	}
}

func TestExpect(t *testing.T) {
	pkt := (&Error{Seq: 3, Errno: unix.ENOSPC, Text: "no slabs"}).Encode(nil, 9)
	var a Ack
	_, err := Expect(pkt, &a)
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "no slabs") {
		t.Fatalf("Expect(ERROR as ACK) = %v, want the peer's ENOSPC", err)
	}
	_, err = Expect((&Evicted{}).Encode(nil, 1), &a)
	if !errors.Is(err, ErrType) {
		t.Fatalf("Expect(EVICTED as ACK) = %v, want ErrType", err)
	}
	h, err := Expect((&Ack{Seq: 4}).Encode(nil, 5), &a)
	if err != nil || a.Seq != 4 || h.Seq != 5 {
		t.Fatalf("Expect(ACK) = %+v %+v %v", h, a, err)
	}
}

func TestErrorTextTruncated(t *testing.T) {
	long := strings.Repeat("y", 3*MaxErrorText)
	_, m, err := Decode((&Error{Seq: 1, Errno: unix.EIO, Text: long}).Encode(nil, 1))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.(*Error).Text; got != long[:MaxErrorText] {
		t.Fatalf("text of %d bytes, want %d", len(got), MaxErrorText)
	}
}

func TestSocketPath(t *testing.T) {
	t.Setenv(EnvSocket, "")
	if got := SocketPath(); got != DefaultSocket {
		t.Fatalf("SocketPath() = %q, want %q", got, DefaultSocket)
	}
	t.Setenv(EnvSocket, "/tmp/x.sock")
	if got := SocketPath(); got != "/tmp/x.sock" {
		t.Fatalf("SocketPath() = %q with %s set", got, EnvSocket)
	}
}

// RingNow reads the clock the shim stamps posts with (CLOCK_MONOTONIC,
// clock_gettime in C): a reading lies between two of the system call's.
func TestRingNowIsMonotonic(t *testing.T) {
	for range 1000 {
		var a, c unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &a)
		b := RingNow()
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &c)
		if time.Duration(a.Nano()) > b || b > time.Duration(c.Nano()) {
			t.Fatalf("RingNow %v outside CLOCK_MONOTONIC's [%v, %v]", b, time.Duration(a.Nano()), time.Duration(c.Nano()))
		}
	}
}
