package pager_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"testing"

	"rmem/pager"
	"rmem/pager/pagertest"
)

// A fork while write-backs are failing: the parent's Staged pages have
// their data in its staging slots, not in the pool, so the child cannot
// share their slab. The fork copies that slab for the child (what the
// child needs of it from the pool, the staged pages from their slots) and
// shares the others. The parent's slab is not written.
func TestForkCopiesStagedSlab(t *testing.T) {
	const spp = 16 // pages per slab
	// The parent's region: slab 0 holds staged pages, slab 1 only pooled
	// ones.
	parent := make([]pager.Page, 2*spp)
	for i := range parent {
		parent[i] = pager.Page(0).With(pager.Remote)
	}
	parent[4] = pager.Page(0).With(pager.Staged)
	parent[5] = pager.Page(0).With(pager.Resident) | pager.FlagDirty
	parent[6] = pager.Page(0).With(pager.Resident) // clean: the pool has it
	parent[7] = pager.Page(0).With(pager.Absent)
	parent[8] = pager.Page(0).With(pager.Lost)
	parent[9] = pager.Page(0).With(pager.Staged)
	staged := map[int][]byte{4: pageOf(4, 2), 9: pageOf(9, 2)}

	for _, forkEvents := range []bool{false, true} {
		t.Run(fmt.Sprintf("fork events %v", forkEvents), func(t *testing.T) {
			store, a, slabs := stagedForkSetup(t, spp)
			child, cslabs, err := a.ForkRegionForTest(slices.Clone(parent), slices.Clone(slabs), maps.Clone(staged), forkEvents)
			if err != nil {
				t.Fatalf("fork: %v", err)
			}
			if cslabs[1] != slabs[1] || !a.SlabShared(slabs[1]) {
				t.Errorf("slab 1, only pooled pages: the child has %d (shared %v), want the parent's %d, shared", cslabs[1], a.SlabShared(slabs[1]), slabs[1])
			}
			if cslabs[0] == 0 || cslabs[0] == slabs[0] || a.SlabShared(slabs[0]) {
				t.Fatalf("slab 0, with staged pages: the child has %d, want a copy of its own of %d (shared %v)", cslabs[0], slabs[0], a.SlabShared(slabs[0]))
			}
			want := slices.Clone(parent)
			want[4], want[9] = pager.Page(0).With(pager.Remote), pager.Page(0).With(pager.Remote)
			if !forkEvents { // the child's registration starts afresh
				want[6] |= pager.FlagDirty
			}
			if !slices.Equal(child, want) {
				t.Errorf("child's pages\n got %v\nwant %v", child, want)
			}
			got := readSlab(t, store, cslabs[0], spp)
			for i := 0; i < spp; i++ {
				switch {
				case want[i].State() == pager.Remote || want[i] == pager.Page(0).With(pager.Resident):
					gen := uint64(1)
					if staged[i] != nil {
						gen = 2
					}
					if !bytes.Equal(got[i], pageOf(i, gen)) {
						t.Errorf("page %d (%v) in the child's slab: %x..., want generation %d", i, want[i], got[i][:16], gen)
					}
				}
			}
			if p := readSlab(t, store, slabs[0], spp); !bytes.Equal(p[4], pageOf(4, 1)) {
				t.Errorf("the parent's slab was written: page 4 is %x...", p[4][:16])
			}
		})
	}

	// The server of slab 0 is gone at the fork: the child's pages that
	// were in it are Lost (SIGBUS, never zeros), a clean resident one is
	// dirty (the pool no longer has it); the staged ones still reach the
	// child's copy.
	t.Run("slab lost", func(t *testing.T) {
		store, a, slabs := stagedForkSetup(t, spp)
		reps, _ := store.Table().Replicas(slabs[0])
		var lost int
		fmt.Sscanf(reps[0].Server, "server-%d", &lost)
		store.Lose(lost)
		child, cslabs, err := a.ForkRegionForTest(slices.Clone(parent), slices.Clone(slabs), maps.Clone(staged), true)
		if err != nil {
			t.Fatalf("fork: %v", err)
		}
		for i := 0; i < spp; i++ {
			want := parent[i]
			switch {
			case staged[i] != nil:
				want = pager.Page(0).With(pager.Remote)
			case want.State() == pager.Remote:
				want = pager.Page(0).With(pager.Lost)
			case want.State() == pager.Resident:
				want |= pager.FlagDirty
			}
			if child[i] != want {
				t.Errorf("page %d: the child has %v, want %v", i, child[i], want)
			}
		}
		got := readSlab(t, store, cslabs[0], spp)
		for i := range staged {
			if !bytes.Equal(got[i], pageOf(i, 2)) {
				t.Errorf("staged page %d in the child's slab: %x...", i, got[i][:16])
			}
		}
	})
}

// stagedForkSetup returns a store of 2 servers with slabs of spp pages,
// an agent over it, and 2 slabs whose every page holds generation 1.
func stagedForkSetup(t *testing.T, spp int) (*pagertest.Store, *pager.Agent, []pager.SlabID) {
	t.Helper()
	store := pagertest.New(t, pagertest.Options{Servers: 2, SlabSize: uint64(spp) * 4096, SlabsPerServer: 8})
	a := startAgent(t, store, 1<<20)
	slabs, err := store.Alloc(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	io, err := store.OpenIO()
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	ops := make([]pager.PageOp, 0, 2*spp)
	for i := 0; i < 2*spp; i++ {
		ops = append(ops, pager.PageOp{Slab: slabs[i/spp], Off: uint64(i%spp) * 4096, Buf: pageOf(i, 1)})
	}
	if err := io.Write(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
	}
	return store, a, slabs
}

// pageOf is page i's contents in generation gen.
func pageOf(i int, gen uint64) []byte {
	b := make([]byte, 4096)
	for w := 0; w < len(b); w += 8 {
		binary.LittleEndian.PutUint64(b[w:], gen<<48|uint64(i)<<16|uint64(w/8))
	}
	return b
}

// readSlab reads the n pages of slab id.
func readSlab(t *testing.T, store *pagertest.Store, id pager.SlabID, n int) [][]byte {
	t.Helper()
	io, err := store.OpenIO()
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	pages := make([][]byte, n)
	ops := make([]pager.PageOp, n)
	for i := range ops {
		pages[i] = make([]byte, 4096)
		ops[i] = pager.PageOp{Slab: id, Off: uint64(i) * 4096, Buf: pages[i]}
	}
	io.Read(context.Background(), ops)
	for i, op := range ops {
		if op.Err != nil {
			t.Fatalf("reading page %d of slab %d: %v", i, id, op.Err)
		}
	}
	return pages
}
