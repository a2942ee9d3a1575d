package userfaultfd

import (
	"math"
	"slices"
	"testing"
)

func TestAddrArithmetic(t *testing.T) {
	const max = Addr(math.MaxUint64)
	for _, tc := range []struct {
		a    Addr
		n    uint64
		want Addr
		ok   bool
	}{
		{0x1000, 0x1000, 0x2000, true},
		{max, 0, max, true},
		{max, 1, 0, false},
		{max - 10, 10, max, true},
		{1, math.MaxUint64, 0, false},
	} {
		got, ok := tc.a.AddLength(tc.n)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%v.AddLength(%d) = %v, %v; want %v, %v", tc.a, tc.n, got, ok, tc.want, tc.ok)
		}
	}
	if got := Addr(0x1fff).RoundDown(0x1000); got != 0x1000 {
		t.Errorf("RoundDown = %v", got)
	}
	if got, ok := Addr(0x1001).RoundUp(0x1000); !ok || got != 0x2000 {
		t.Errorf("RoundUp = %v %v", got, ok)
	}
	if got, ok := Addr(0x2000).RoundUp(0x1000); !ok || got != 0x2000 {
		t.Errorf("RoundUp aligned = %v %v", got, ok)
	}
	if _, ok := (max - 5).RoundUp(0x1000); ok {
		t.Error("RoundUp near the top must overflow")
	}
}

func TestRange(t *testing.T) {
	r := Range{Start: 0x10000, Len: 0x3000}
	if end, ok := r.End(); !ok || end != 0x13000 {
		t.Fatalf("End = %v %v", end, ok)
	}
	for a, want := range map[Addr]bool{0xffff: false, 0x10000: true, 0x12fff: true, 0x13000: false} {
		if r.Contains(a) != want {
			t.Errorf("Contains(%v) != %v", a, want)
		}
	}
	for _, tc := range []struct {
		o    Range
		want bool
	}{
		{Range{0xf000, 0x1000}, false},
		{Range{0xf000, 0x1001}, true},
		{Range{0x12fff, 10}, true},
		{Range{0x13000, 10}, false},
		{Range{0x11000, 0}, false},
		{Range{0, math.MaxUint64}, true},
	} {
		if got := r.Overlaps(tc.o); got != tc.want {
			t.Errorf("Overlaps(%v) = %v", tc.o, got)
		}
		if got := tc.o.Overlaps(r); got != tc.want {
			t.Errorf("%v.Overlaps(r) = %v (not symmetric)", tc.o, got)
		}
	}
	if !r.ContainsRange(Range{0x11000, 0x2000}) || r.ContainsRange(Range{0x11000, 0x2001}) {
		t.Error("ContainsRange")
	}
	if (Range{Start: math.MaxUint64 - 1, Len: 4}).WellFormed() {
		t.Error("wrapping range is well formed")
	}
	pages := slices.Collect(Range{Start: 0x10800, Len: 0x1000}.Pages(0x1000))
	if !slices.Equal(pages, []Addr{0x10000, 0x11000}) {
		t.Errorf("Pages = %v", pages)
	}
	top := Range{Start: Addr(math.MaxUint64 - 0x1fff), Len: 0x2000}
	if got := slices.Collect(top.Pages(0x1000)); len(got) != 0 {
		// End overflows by one byte past the top: not well formed.
		t.Errorf("Pages of an overflowing range = %v", got)
	}
	top.Len = 0x1fff
	if got := slices.Collect(top.Pages(0x1000)); len(got) != 2 {
		t.Errorf("Pages at the top of the address space = %v", got)
	}
	if n := (Range{0, 0x2001}).NumPages(0x1000); n != 3 {
		t.Errorf("NumPages = %d", n)
	}
	if _, ok := RangeFromTo(5, 4); ok {
		t.Error("RangeFromTo accepted end < start")
	}
	if err := pageRange(Range{0x1000, 0}); err == nil {
		t.Error("empty range accepted")
	}
	if err := pageRange(Range{0x1001, 0x1000}); err == nil {
		t.Error("unaligned range accepted")
	}
}

func TestNames(t *testing.T) {
	if got := (FeatureWPAsync | FeatureMove | 1<<40).String(); got != "WP_ASYNC|MOVE|bit40" {
		t.Errorf("Feature.String = %q", got)
	}
	if got := (IoctlCopy | IoctlAPI).String(); got != "COPY|API" {
		t.Errorf("Ioctls.String = %q", got)
	}
	if got := (ModeMissing | ModeMinor).String(); got != "MISSING|MINOR" {
		t.Errorf("Mode.String = %q", got)
	}
	if got := EventKind(0x99).String(); got != "EVENT(0x99)" {
		t.Errorf("EventKind.String = %q", got)
	}
}
