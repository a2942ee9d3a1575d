package traced

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestFilter runs the seccomp program in x/net/bpf's VM: traced calls
// stop at the tracer unless they come from the code page; others, and
// other architectures, pass.
func TestFilter(t *testing.T) {
	for _, code := range []uint64{0x7f12_3456_7000, 0x5555_ffff_f000, 0x1000} {
		raw := make([]bpf.Instruction, 0, 32)
		for _, ins := range filter(code) {
			raw = append(raw, bpf.RawInstruction{Op: ins.Code, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}.Disassemble())
		}
		vm, err := bpf.NewVM(raw)
		if err != nil {
			t.Fatalf("code %#x: %v", code, err)
		}
		run := func(nr, arch uint32, ip uint64) uint32 {
			// seccomp_data is read in the CPU's order; the VM reads
			// words big-endian, so each word is stored that way.
			d := make([]byte, 64)
			binary.BigEndian.PutUint32(d[offNr:], nr)
			binary.BigEndian.PutUint32(d[offArch:], arch)
			binary.BigEndian.PutUint32(d[offIPLow:], uint32(ip))
			binary.BigEndian.PutUint32(d[offIPHigh:], uint32(ip>>32))
			r, err := vm.Run(d)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(r)
		}
		elsewhere := uint64(0x4010_0000)
		for _, nr := range tracedCalls {
			if got := run(nr, auditArchX8664, elsewhere); got != retTrace {
				t.Errorf("code %#x: call %d from the program: %#x, want TRACE", code, nr, got)
			}
			for _, ip := range []uint64{code, code + 2, code + 4095} {
				if got := run(nr, auditArchX8664, ip); got != retAllow {
					t.Errorf("code %#x: call %d from %#x (the code page): %#x, want ALLOW", code, nr, ip, got)
				}
			}
			for _, ip := range []uint64{code + 4096, code - 1, code ^ 1<<40} {
				if got := run(nr, auditArchX8664, ip); got != retTrace {
					t.Errorf("code %#x: call %d from %#x (next to the code page): %#x, want TRACE", code, nr, ip, got)
				}
			}
			if got := run(nr, 0x40000003 /* i386 */, elsewhere); got != retAllow {
				t.Errorf("code %#x: call %d of another architecture: %#x, want ALLOW", code, nr, got)
			}
		}
		for _, nr := range []uint32{unix.SYS_READ, unix.SYS_FUTEX, unix.SYS_MPROTECT, unix.SYS_VFORK, unix.SYS_MUNMAP} {
			if got := run(nr, auditArchX8664, elsewhere); got != retAllow {
				t.Errorf("code %#x: call %d: %#x, want ALLOW", code, nr, got)
			}
		}
	}
}

func TestRegions(t *testing.T) {
	var rs regions
	a := rs.add(0x10000, 0x20000)
	b := rs.add(0x30000, 0x40000)
	if got := rs.overlapping(0x1f000, 0x31000); len(got) != 2 {
		t.Fatalf("overlapping: %v", got)
	}
	if got := rs.overlapping(0x20000, 0x30000); len(got) != 0 {
		t.Fatalf("the gap overlaps %v", got)
	}
	rs.forgetCovered(0x10000, 0x1f000) // part of a: kept
	if len(rs.list) != 2 {
		t.Fatalf("a region partly unmapped was forgotten: %v", rs.list)
	}
	rs.forgetCovered(0x0, 0x20000)
	if len(rs.list) != 1 || rs.list[0] != b {
		t.Fatalf("after unmapping a: %v", rs.list)
	}
	c := rs.add(0x50000, 0x60000)
	rs.forgetOverlapping(0x3f000, 0x51000) // b and c
	if len(rs.list) != 0 || a.id == b.id || b.id == c.id {
		t.Fatalf("after forgetOverlapping: %v", rs.list)
	}
	rs.put(b)
	rs.remove(b.id)
	if len(rs.list) != 0 {
		t.Fatalf("after remove: %v", rs.list)
	}
}
