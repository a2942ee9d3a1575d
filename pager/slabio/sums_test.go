package slabio

import (
	"sync/atomic"
	"testing"
)

// A write of part of a page drops the sums of the pages it touches and
// keeps the others'; a whole page's sum is its CRC32C, marked valid.
func TestRecordSums(t *testing.T) {
	sums := make([]atomic.Uint64, 4)
	page := make([]byte, 2*pageSize)
	page[5] = 1
	recordSums(sums, pageSize, page)
	if sums[0].Load() != 0 || sums[1].Load()&sumValid == 0 || sums[2].Load()&sumValid == 0 || sums[3].Load() != 0 {
		t.Fatalf("two whole pages at 1: sums %v %v %v %v", sums[0].Load(), sums[1].Load(), sums[2].Load(), sums[3].Load())
	}
	if n, _ := badPages(sums, pageSize, page); n != 0 {
		t.Fatalf("the pages just recorded: %d bad", n)
	}
	page[pageSize+7] ^= 1
	if n, at := badPages(sums, pageSize, page); n != 1 || at != 2*pageSize {
		t.Fatalf("second page changed: %d bad at %d, want 1 at %d", n, at, 2*pageSize)
	}
	recordSums(sums, 2*pageSize-10, make([]byte, 20)) // across pages 1 and 2, in part
	if sums[1].Load() != 0 || sums[2].Load() != 0 {
		t.Fatal("a write of part of two pages kept their sums")
	}
	if n, _ := badPages(sums, pageSize, page); n != 0 {
		t.Fatalf("pages without sums: %d bad", n)
	}
}

// BenchmarkPageSum is what a checksum adds to each page read or written.
func BenchmarkPageSum(b *testing.B) {
	p := make([]byte, pageSize)
	b.SetBytes(pageSize)
	for b.Loop() {
		pageSum(p)
	}
}
