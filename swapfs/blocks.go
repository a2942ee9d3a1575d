package swapfs

import (
	"math/bits"
	"sync/atomic"

	"rmem/pager/remote"
)

// BlockSize is the size of one block of the swap file: a page.
const BlockSize = 4096

// Block is the index of a 4 KiB block of the swap file.
type Block uint64

// SlabIndex is the index of a slab of the swap file (its position, not the
// pool's SlabID).
type SlabIndex uint64

// layout is the derived mapping from file offsets to slab addresses.
type layout struct {
	blocks        uint64 // blocks in the file
	blocksPerSlab uint64
}

// slabOf returns the slab holding block b and b's byte offset in it.
func (l layout) slabOf(b Block) (SlabIndex, uint64) {
	return SlabIndex(uint64(b) / l.blocksPerSlab), (uint64(b) % l.blocksPerSlab) * BlockSize
}

// slabs returns the number of slabs the file spans.
func (l layout) slabs() uint64 {
	return (l.blocks + l.blocksPerSlab - 1) / l.blocksPerSlab
}

// bitmap is a set of blocks, safe for concurrent use without a lock.
type bitmap []atomic.Uint64

func newBitmap(n uint64) bitmap { return make(bitmap, (n+63)/64) }

func (m bitmap) has(b Block) bool { return m[b/64].Load()&(1<<(b%64)) != 0 }

func (m bitmap) set(b Block) { m[b/64].Or(1 << (b % 64)) }

// count returns the number of blocks in the set.
func (m bitmap) count() uint64 {
	var n int
	for i := range m {
		n += bits.OnesCount64(m[i].Load())
	}
	return uint64(n)
}

// segment is the part of a request inside one block.
type segment struct {
	block Block
	inner uint64 // offset in the block
	n     uint64 // bytes
}

// segments calls f for each block-sized piece of [off, off+n), in order.
func segments(off, n uint64, f func(s segment) bool) {
	for n > 0 {
		s := segment{block: Block(off / BlockSize), inner: off % BlockSize}
		s.n = min(BlockSize-s.inner, n)
		if !f(s) {
			return
		}
		off += s.n
		n -= s.n
	}
}

// add appends a transfer of buf to offset off of slab id (index si) to
// w's batch, merging it into the last op when both the slab range and the
// buffer are contiguous. It returns false if the batch is full.
func (w *worker) add(si SlabIndex, id remote.SlabID, off uint64, buf []byte) bool {
	if k := len(w.ops); k > 0 {
		last := &w.ops[k-1]
		if last.Slab == id && last.Off+uint64(len(last.Buf)) == off && contiguous(last.Buf, buf) {
			last.Buf = last.Buf[:len(last.Buf)+len(buf)]
			return true
		}
	}
	if len(w.ops) == cap(w.ops) {
		return false
	}
	w.ops = append(w.ops, remote.PageOp{Slab: id, Off: off, Buf: buf})
	w.idx = append(w.idx, si)
	return true
}

// contiguous reports whether b starts right where a ends in the same array
// (so a can be extended over b).
func contiguous(a, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if cap(a)-len(a) < len(b) {
		return false
	}
	return &a[:len(a)+1][len(a)] == &b[0]
}
