package pager

import (
	"slices"
	"testing"
)

// slabRefs: a slab shared by n regions is freed by the last release only.
func TestSlabRefs(t *testing.T) {
	var s slabRefs
	if s.shared(7) {
		t.Fatal("a slab no one shared is shared")
	}
	s.share(7) // parent and child
	s.share(7) // and a grandchild
	if !s.shared(7) {
		t.Fatal("not shared")
	}
	if free := s.release([]SlabID{7, 8}); !slices.Equal(free, []SlabID{8}) {
		t.Fatalf("first release frees %v, want only the unshared 8", free)
	}
	if free := s.release([]SlabID{7}); len(free) != 0 || s.shared(7) {
		t.Fatalf("second release frees %v (shared %v), want none and one reference left", free, s.shared(7))
	}
	if free := s.release([]SlabID{7}); !slices.Equal(free, []SlabID{7}) {
		t.Fatalf("last release frees %v, want 7", free)
	}
	if len(s.refs) != 0 {
		t.Fatalf("refs left: %v", s.refs)
	}
}
