package userfaultfd

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// openOrSkip opens a uffd with features, skipping the test with the reason
// when this machine cannot (not root, no userfaultfd, missing feature).
func openOrSkip(t testing.TB, features Feature) *UFFD {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (userfaultfd of other processes, pagemap, EVENT_FORK)")
	}
	u, err := Open(features)
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrFeature) {
		t.Skipf("kernel cannot do this test: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// skipUnlessFeatures skips when the kernel lacks features (for tests whose
// uffd is opened by a child process).
func skipUnlessFeatures(t testing.TB, features Feature) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (userfaultfd of other processes, pagemap, EVENT_FORK)")
	}
	avail, _, err := Probe()
	if err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	if !avail.Has(features) {
		t.Skipf("kernel lacks userfaultfd features %v", features&^avail)
	}
}

func mmapAnon(t testing.TB, size int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// fillPattern writes the test pattern of page idx, generation gen into p:
// every 8-byte word holds a value derived from both and the word index.
func fillPattern(p []byte, idx, gen uint64) {
	for w := 0; w+8 <= len(p); w += 8 {
		binary.LittleEndian.PutUint64(p[w:], pattern(idx, gen, uint64(w/8)))
	}
}

func pattern(idx, gen, word uint64) uint64 {
	x := idx<<32 ^ gen<<56 ^ word ^ 0x9e3779b97f4a7c15
	x ^= x >> 29
	return x * 0xbf58476d1ce4e5b9
}

// checkPattern returns the first word index of p that differs from the
// pattern, or -1.
func checkPattern(p []byte, idx, gen uint64) int {
	for w := 0; w+8 <= len(p); w += 8 {
		if binary.LittleEndian.Uint64(p[w:]) != pattern(idx, gen, uint64(w/8)) {
			return w / 8
		}
	}
	return -1
}

func isZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}
