package slabio

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"rmem/pager/remote"
)

// Checksums. A memory server with a bad DIMM, a transport bug or a stray
// write would otherwise hand a program wrong bytes without a word. So
// every whole page an IO writes gets a CRC32C in its slab's entry, and
// every whole page it reads is checked against it before the caller sees
// it (remote.PageIO's contract). CRC32C runs in hardware here (SSE4.2):
// 0.16 µs a page (BenchmarkPageSum), beside a READ of 10 µs or more.
//
// A sum is the CRC in the low 32 bits and sumValid: 0 is no sum (a slab
// never written, a page written in part), and such a page is not checked.
// Sums live as long as the Table's entry for the slab, in the agent's
// memory, and, with PersistSums, in a file per slab that the next agent
// loads when it adopts the slab (Table.Adopt). The order that makes the
// files safe across a crash: a WRITE completes, then its sums are stored
// (memory, then file); a page whose write-back the agent died in is still
// in its staging slot by the journal (pager/journal.go) and written again
// by the next agent, which records its sum then; a slot a page does not
// name yet (relocation) is not read.

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
// put in the slab, and returns the pages whose sums it set, [lo, hi).
// Pages it covers in part lose theirs.
func recordSums(sums []atomic.Uint64, off uint64, buf []byte) (lo, hi int) {
	first, n := pageSpan(off, buf)
	if n == 0 {
		lo, hi = int(off/pageSize), int((off+uint64(len(buf))+pageSize-1)/pageSize)
		hi = min(hi, len(sums))
		for i := lo; i < hi; i++ {
			sums[i].Store(0)
		}
		return lo, max(lo, hi)
	}
	hi = min(first+n, len(sums))
	for i := first; i < hi; i++ {
		j := i - first
		sums[i].Store(pageSum(buf[j*pageSize : (j+1)*pageSize]))
	}
	return first, max(first, hi)
}

// sumFile keeps a slab's sums for the agent after this one (PersistSums):
// 8 bytes a page, little endian, written through after each Write. A file
// that could not be written is removed, never left behind a sum it missed
// (the next agent would take a good page for a bad one).
type sumFile struct {
	f      *os.File
	path   string
	broken atomic.Bool
}

// write stores sums[lo:hi] in the file, encoded in scratch (grown as
// needed), and returns scratch.
func (sf *sumFile) write(sums []atomic.Uint64, lo, hi int, scratch []byte) []byte {
	if sf == nil || hi <= lo || sf.broken.Load() {
		return scratch
	}
	scratch = scratch[:0]
	for i := lo; i < hi; i++ {
		scratch = binary.LittleEndian.AppendUint64(scratch, sums[i].Load())
	}
	if _, err := sf.f.WriteAt(scratch, int64(lo)*8); err != nil {
		sf.drop()
	}
	return scratch
}

// drop removes the file: its slab's pages go unchecked by the next agent.
func (sf *sumFile) drop() {
	if sf.broken.Swap(true) {
		return
	}
	os.Remove(sf.path)
	sf.f.Close()
}

// openSumFile returns the sum file of slab id in dir, with the sums it
// holds loaded into sums when keep is set (an adopted slab), or made anew.
func openSumFile(dir string, id remote.SlabID, sums []atomic.Uint64, keep bool) (*sumFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "sums-"+strconv.FormatUint(uint64(id), 10))
	size := int64(len(sums)) * 8
	if keep {
		if b, err := os.ReadFile(path); err == nil && int64(len(b)) == size {
			for i := range sums {
				sums[i].Store(binary.LittleEndian.Uint64(b[i*8:]))
			}
		} else {
			keep = false
		}
	}
	flag := os.O_RDWR | os.O_CREATE
	if !keep {
		flag |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err == nil {
		err = f.Truncate(size)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.Remove(path)
		return nil, err
	}
	return &sumFile{f: f, path: path}, nil
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
