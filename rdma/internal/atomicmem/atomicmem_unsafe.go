package atomicmem

import (
	"sync/atomic"
	"unsafe"
)

// word returns the word at b[0:8]. b must have at least 8 bytes and be
// 8-byte aligned in memory (see Aligned).
func word(b []byte) *uint64 {
	if len(b) < 8 {
		panic("atomicmem: word needs 8 bytes")
	}
	return (*uint64)(unsafe.Pointer(&b[0]))
}

// Aligned reports whether b has at least 8 bytes and starts on an 8-byte
// boundary in memory.
func Aligned(b []byte) bool {
	return len(b) >= 8 && uintptr(unsafe.Pointer(&b[0]))%8 == 0
}

// CompareAndSwap sets the word at b to swap if it equals cmp and returns its
// old value. b must satisfy Aligned.
func CompareAndSwap(b []byte, cmp, swap uint64) uint64 {
	w := word(b)
	for {
		old := atomic.LoadUint64(w)
		if old != cmp {
			return old
		}
		if atomic.CompareAndSwapUint64(w, cmp, swap) {
			return old
		}
	}
}

// FetchAdd adds add to the word at b and returns its old value. b must
// satisfy Aligned.
func FetchAdd(b []byte, add uint64) uint64 {
	return atomic.AddUint64(word(b), add) - add
}

// Load atomically loads the word at b. b must satisfy Aligned.
func Load(b []byte) uint64 { return atomic.LoadUint64(word(b)) }

// Store atomically stores v at b. b must satisfy Aligned.
func Store(b []byte, v uint64) { atomic.StoreUint64(word(b), v) }

// Load32 and Store32 act on a 4-byte aligned uint32 at b[0:4].
func Load32(b []byte) uint32 {
	need4(b)
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[0])))
}

// Store32 atomically stores v at b[0:4] (4-byte aligned).
func Store32(b []byte, v uint32) {
	need4(b)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[0])), v)
}

// Swap32 atomically exchanges the uint32 at b[0:4] (4-byte aligned).
func Swap32(b []byte, v uint32) uint32 {
	need4(b)
	return atomic.SwapUint32((*uint32)(unsafe.Pointer(&b[0])), v)
}

// need4 checks the length without touching memory (an `_ = b[3]` would be a
// plain read to the race detector).
func need4(b []byte) {
	if len(b) < 4 {
		panic("atomicmem: word needs 4 bytes")
	}
}
