package userfaultfd

import (
	"fmt"
	"iter"

	"golang.org/x/sys/unix"
)

// PageSize is the base page size of the running kernel in bytes.
var PageSize = uint64(unix.Getpagesize())

// Addr is a virtual address, usually in the address space of the process
// whose memory a UFFD serves (not the caller's).
type Addr uintptr

// AddLength returns a+n and whether the sum did not overflow.
func (a Addr) AddLength(n uint64) (Addr, bool) {
	end := a + Addr(n)
	return end, uint64(end) >= uint64(a) && uint64(Addr(n)) == n
}

// RoundDown returns a rounded down to a multiple of align (a power of two).
func (a Addr) RoundDown(align uint64) Addr {
	return a &^ Addr(align-1)
}

// RoundUp returns a rounded up to a multiple of align (a power of two) and
// whether that did not overflow.
func (a Addr) RoundUp(align uint64) (Addr, bool) {
	end, ok := a.AddLength(align - 1)
	if !ok {
		return 0, false
	}
	return end.RoundDown(align), true
}

// IsAligned reports whether a is a multiple of align (a power of two).
func (a Addr) IsAligned(align uint64) bool {
	return uint64(a)&(align-1) == 0
}

// String formats a in hex.
func (a Addr) String() string {
	return fmt.Sprintf("%#x", uint64(a))
}

// Range is the half-open address range [Start, Start+Len).
type Range struct {
	Start Addr
	Len   uint64
}

// RangeFromTo returns [start, end) and false if end < start.
func RangeFromTo(start, end Addr) (Range, bool) {
	if end < start {
		return Range{}, false
	}
	return Range{Start: start, Len: uint64(end - start)}, true
}

// End returns the first address after r and whether it did not overflow.
func (r Range) End() (Addr, bool) {
	return r.Start.AddLength(r.Len)
}

// WellFormed reports whether r's end does not overflow.
func (r Range) WellFormed() bool {
	_, ok := r.End()
	return ok
}

// Contains reports whether a lies in r.
func (r Range) Contains(a Addr) bool {
	return a >= r.Start && uint64(a-r.Start) < r.Len
}

// ContainsRange reports whether o lies entirely in r (an empty o at r's
// end counts as contained).
func (r Range) ContainsRange(o Range) bool {
	if !o.WellFormed() || o.Start < r.Start {
		return false
	}
	off := uint64(o.Start - r.Start)
	return off <= r.Len && o.Len <= r.Len-off
}

// Overlaps reports whether r and o share at least one address.
func (r Range) Overlaps(o Range) bool {
	if r.Len == 0 || o.Len == 0 {
		return false
	}
	return r.Contains(o.Start) || o.Contains(r.Start)
}

// PageAligned reports whether both ends of r are multiples of page.
func (r Range) PageAligned(page uint64) bool {
	return r.Start.IsAligned(page) && r.Len&(page-1) == 0
}

// NumPages returns the number of pages of size page that r covers
// (r.Len rounded up).
func (r Range) NumPages(page uint64) uint64 {
	return r.Len/page + min(r.Len%page, 1)
}

// Pages yields the start of every page of size page that r covers, from
// the page containing r.Start up to the one containing r's last byte.
func (r Range) Pages(page uint64) iter.Seq[Addr] {
	return func(yield func(Addr) bool) {
		if r.Len == 0 {
			return
		}
		end, ok := r.End()
		if !ok {
			return
		}
		for a := r.Start.RoundDown(page); a < end; a += Addr(page) {
			if !yield(a) {
				return
			}
			if a+Addr(page) < a { // last page of the address space
				return
			}
		}
	}
}

// String formats r as [start, end).
func (r Range) String() string {
	end, ok := r.End()
	if !ok {
		return fmt.Sprintf("[%v, overflow)", r.Start)
	}
	return fmt.Sprintf("[%v, %v)", r.Start, end)
}

// pageRange validates that r is non-empty, page aligned and does not wrap.
func pageRange(r Range) error {
	if r.Len == 0 {
		return fmt.Errorf("%w: empty range at %v", ErrRange, r.Start)
	}
	if !r.WellFormed() {
		return fmt.Errorf("%w: %v overflows", ErrRange, r)
	}
	if !r.PageAligned(PageSize) {
		return fmt.Errorf("%w: %v is not aligned to %d-byte pages", ErrRange, r, PageSize)
	}
	return nil
}
