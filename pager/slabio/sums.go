package slabio

import (
	"hash/crc32"
	"sync/atomic"
)

// Checksums. A memory server with a bad DIMM, a transport bug or a stray
// write would otherwise hand a program wrong bytes without a word. So
// every whole page an IO writes gets a CRC32C in its slab's entry, and
// every whole page it reads is checked against it before the caller sees
// it (remote.PageIO's contract). CRC32C runs in hardware here (SSE4.2):
// ~0.3 µs a page, beside a READ of 10 µs or more.
//
// A sum is the CRC in the low 32 bits and sumValid: 0 is no sum (a slab
// never written, a page written in part), and such a page is not checked.
// Sums live as long as the Table's entry for the slab, in the agent's
// memory: an agent that takes over its predecessor's slabs has none for
// the pages written before (they are checked again once rewritten).

const pageSize = 4096

const sumValid = 1 << 32

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func pageSum(p []byte) uint64 { return sumValid | uint64(crc32.Checksum(p, castagnoli)) }

// pageSpan returns the pages of sums that buf at byte offset off covers
// whole: sums[first:first+n], and n is 0 when buf is not page-aligned.
func pageSpan(off uint64, buf []byte) (first, n int) {
	if off%pageSize != 0 || len(buf)%pageSize != 0 {
		return 0, 0
	}
	return int(off / pageSize), len(buf) / pageSize
}

// recordSums records the sums of what a successful Write of buf at off
// put in the slab. Pages it covers in part lose theirs.
func recordSums(sums []atomic.Uint64, off uint64, buf []byte) {
	first, n := pageSpan(off, buf)
	if n == 0 {
		lo, hi := off/pageSize, (off+uint64(len(buf))+pageSize-1)/pageSize
		for i := lo; i < hi && i < uint64(len(sums)); i++ {
			sums[i].Store(0)
		}
		return
	}
	for j := 0; j < n && first+j < len(sums); j++ {
		sums[first+j].Store(pageSum(buf[j*pageSize : (j+1)*pageSize]))
	}
}

// badPages returns how many whole pages of buf, read at off, fail their
// sums, and the offset of the first.
func badPages(sums []atomic.Uint64, off uint64, buf []byte) (n int, at uint64) {
	first, pages := pageSpan(off, buf)
	for j := 0; j < pages && first+j < len(sums); j++ {
		want := sums[first+j].Load()
		if want&sumValid == 0 {
			continue
		}
		if pageSum(buf[j*pageSize:(j+1)*pageSize]) != want {
			if n == 0 {
				at = off + uint64(j*pageSize)
			}
			n++
		}
	}
	return n, at
}
