package preload

import (
	"encoding/binary"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// TestCLayoutMatchesGo decodes packets built from preload/proto.h's
// structs with pager/proto, and compares the fault ring's layout, states
// and flags: the two sides of the protocol agree.
func TestCLayoutMatchesGo(t *testing.T) {
	out, err := exec.Command(filepath.Join(build(t), "protodump")).Output()
	if err != nil {
		t.Fatal(err)
	}
	ev := &proto.Evict{Batch: 9, N: 2}
	ev.Pages[0] = proto.EvictPage{Addr: 0x1000}
	ev.Pages[1] = proto.EvictPage{Addr: 0x3000, Slot: 5}
	ev2 := &proto.Evict{Batch: 10, N: 1}
	ev2.Pages[0] = proto.EvictPage{Addr: 0x5000, Slot: proto.NoSlot}
	want := []proto.Message{
		&proto.Hello{PID: 1234, PPID: 1, Features: 0x147, PageSize: 4096, Flags: proto.HelloUFFD, LocalMem: 64 << 20, MaxSlowdown: 20000},
		&proto.RegionAdd{ID: 7, Range: userfaultfd.Range{Start: 0x7f0000000000, Len: 1 << 20}, Kind: proto.KindMmap},
		&proto.RegionDel{ID: 7, Range: userfaultfd.Range{Start: 0x7f0000001000, Len: 8192}},
		&proto.Evicted{Batch: 1 << 40, Done: 3, Errno: unix.EFAULT},
		ev,
		&proto.Welcome{ClientID: 3, MinAlloc: 1 << 20, StagingSlots: 64, Flags: proto.WelcomeUFFD},
		&proto.Error{Seq: 2, Errno: unix.ENOMEM, Text: "no memory"},
		&proto.RegionZap{ID: 7, Range: userfaultfd.Range{Start: 0x7f0000002000, Len: 4096}},
		ev2,
		&proto.UFFDDevice{},
		&proto.ForkPrepare{Serial: 3},
		&proto.ForkDone{Serial: 3, PID: -int32(unix.EAGAIN)},
		&proto.Hello{PID: 1235, PPID: 1234, ForkSerial: 3, Features: 0x146, PageSize: 4096, Flags: proto.HelloUFFD},
		&proto.Hello{PID: 1236, PPID: 1, Features: 0x147, PageSize: 4096, Flags: proto.HelloUFFD | proto.HelloResume},
		&proto.RegionAdd{ID: 8, Range: userfaultfd.Range{Start: 0x7f0000100000, Len: 1 << 21}, Kind: proto.KindHeap, Flags: proto.RegionResumed},
		&proto.ResumeDone{Regions: 1},
		&proto.Hello{PID: 1237, PPID: 1, Features: 0x1c7, PageSize: 4096, Flags: proto.HelloUFFD | proto.HelloRing},
		&proto.Welcome{ClientID: 4, StagingSlots: 64, Flags: proto.WelcomeUFFD | proto.WelcomeRing},
		&proto.RegionAdd{ID: 9, Range: userfaultfd.Range{Start: 0x7f0000200000, Len: 1 << 20}, Kind: proto.KindShared},
		&proto.Handoff{PID: 1238, Flags: proto.HandoffExec, N: 2, FDs: [proto.HandoffMaxFDs]int32{5, 9}},
	}
	for i, w := range want {
		if len(out) < 4 {
			t.Fatalf("packet %d missing", i)
		}
		n := binary.LittleEndian.Uint32(out)
		pkt := out[4 : 4+n]
		out = out[4+n:]
		h, m, err := proto.Decode(pkt)
		if err != nil {
			t.Fatalf("packet %d (%v): %v", i, w.Type(), err)
		}
		if h.Seq != uint32(i+1) || !reflect.DeepEqual(m, w) {
			t.Errorf("packet %d: seq %d %+v, want %+v", i, h.Seq, m, w)
		}
	}
	// The fault ring's layout (ring.go) and the descriptors a WELCOME
	// may carry.
	ring := []uint32{
		proto.RingSize, proto.RingEntries, proto.RingEntrySize, proto.RingMagic,
		proto.RingHdrMagic, proto.RingHdrEntries, proto.RingHdrAgent, proto.RingHdrPosted, proto.RingHdrDoorbells,
		uint32(proto.RingEntryOffset(0)), uint32(proto.RingEntryOffset(1)),
		proto.RingEntState, proto.RingEntWaiters, proto.RingEntTID, proto.RingEntFlags, proto.RingEntAddr, proto.RingEntPosted,
		proto.RingAwake, proto.RingAsleep,
		proto.RingFree, proto.RingClaimed, proto.RingPosted, proto.RingServing,
		proto.RingDone, proto.RingLost, proto.RingNotMine, proto.RingWrite,
		proto.MaxFDs,
	}
	if len(out) < 4 || int(binary.LittleEndian.Uint32(out)) != 4*len(ring) || len(out) != 4+4*len(ring) {
		t.Fatalf("the ring's layout: %d bytes, want %d words", len(out), len(ring))
	}
	for i, w := range ring {
		if got := binary.LittleEndian.Uint32(out[4+4*i:]); got != w {
			t.Errorf("the ring's layout, word %d: C %d, Go %d", i, got, w)
		}
	}
}
