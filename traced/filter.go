package traced

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// tracedCalls are the system calls the seccomp filter stops at the
// tracer: what maps memory or drops its pages, and what forks. munmap is
// not one: the agent hears of it from the uffd (UNMAP events), and the
// tracer's copy of the regions forgets a region when a new one takes its
// place.
var tracedCalls = []uint32{
	unix.SYS_MMAP, unix.SYS_MREMAP, unix.SYS_BRK, unix.SYS_MADVISE,
	unix.SYS_CLONE, unix.SYS_CLONE3, unix.SYS_FORK,
}

// seccomp_data offsets, and the classic BPF this filter needs.
const (
	offNr     = 0
	offArch   = 4
	offIPLow  = 8
	offIPHigh = 12

	bpfLdAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K

	auditArchX8664 = 0xc000003e
	retAllow       = unix.SECCOMP_RET_ALLOW
	retTrace       = unix.SECCOMP_RET_TRACE
)

// filter returns the seccomp program: a system call made from the code
// page at code (4 KiB) is allowed, as is any of another architecture;
// tracedCalls stop at the tracer; the rest are allowed.
func filter(code uint64) []unix.SockFilter {
	lo, hi := uint32(code), uint32(code>>32)
	n := len(tracedCalls)
	// Layout: 0 ld arch; 1 jeq; 2 ld ip.hi; 3 jeq; 4 ld ip.lo; 5 jge lo;
	// 6 jge lo+4096; 7 ld nr; 8..8+n-1 jeq nr; 8+n ret allow; 9+n ret trace.
	allow := 8 + n
	at := func(i, target int) uint8 { return uint8(target - i - 1) }
	f := []unix.SockFilter{
		{Code: bpfLdAbsW, K: offArch},
		{Code: bpfJeqK, K: auditArchX8664, Jt: 0, Jf: at(1, allow)},
		{Code: bpfLdAbsW, K: offIPHigh},
		{Code: bpfJeqK, K: hi, Jt: 0, Jf: at(3, 7)},
		{Code: bpfLdAbsW, K: offIPLow},
		{Code: bpfJgeK, K: lo, Jt: 0, Jf: at(5, 7)},
		{Code: bpfJgeK, K: lo + 4096, Jt: at(6, 7), Jf: at(6, allow)},
		{Code: bpfLdAbsW, K: offNr},
	}
	if lo+4096 < lo { // the page ends at a 4 GiB boundary: lo alone decides
		f[6] = unix.SockFilter{Code: bpfJeqK, K: 0, Jt: at(6, allow), Jf: at(6, allow)}
	}
	for i, nr := range tracedCalls {
		f = append(f, unix.SockFilter{Code: bpfJeqK, K: nr, Jt: at(8+i, allow+1), Jf: 0})
	}
	return append(f,
		unix.SockFilter{Code: bpfRetK, K: retAllow},
		unix.SockFilter{Code: bpfRetK, K: retTrace})
}

// encodeFilter lays out a struct sock_fprog at addr in b (the program's
// view of b starts at addr) with its instructions after it, and returns
// the bytes used.
func encodeFilter(b []byte, addr uint64, f []unix.SockFilter) int {
	le := binary.LittleEndian
	le.PutUint16(b[0:], uint16(len(f)))
	le.PutUint64(b[8:], addr+16)
	for i, ins := range f {
		o := 16 + 8*i
		le.PutUint16(b[o:], ins.Code)
		b[o+2], b[o+3] = ins.Jt, ins.Jf
		le.PutUint32(b[o+4:], ins.K)
	}
	return 16 + 8*len(f)
}
