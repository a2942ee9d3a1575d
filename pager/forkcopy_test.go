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
	"rmem/pager/remote"
)

// A fork gives the child the parent's pool slots by reference (no page
// moves) and, for pages whose write-back had failed (Staged: their data in
// the parent's staging slots), slots of its own written from the staging
// slots. The parent's slots are not written.
func TestForkCopiesStaged(t *testing.T) {
	const n = 16
	parent := make([]pager.Page, n)
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
			store, a, slots := stagedForkSetup(t, parent)
			child, cslots, err := a.ForkRegionForTest(slices.Clone(parent), slices.Clone(slots), maps.Clone(staged), forkEvents)
			if err != nil {
				t.Fatalf("fork: %v", err)
			}
			want := slices.Clone(parent)
			want[4], want[9] = pager.Page(0).With(pager.Remote), pager.Page(0).With(pager.Remote)
			if !forkEvents { // the child's registration starts afresh
				want[6] |= pager.FlagDirty
			}
			if !slices.Equal(child, want) {
				t.Errorf("child's pages\n got %v\nwant %v", child, want)
			}
			for i := range n {
				switch {
				case staged[i] != nil:
					if cslots[i] == 0 || cslots[i] == slots[i] || a.SlotRefs(cslots[i]) != 1 {
						t.Errorf("staged page %d: child slot %d (refs %d), want one of its own, not the parent's %d", i, cslots[i], a.SlotRefs(cslots[i]), slots[i])
					}
					if got := readSlot(t, store, a, cslots[i]); !bytes.Equal(got, pageOf(i, 2)) {
						t.Errorf("staged page %d in the child's slot: %x..., want generation 2", i, got[:16])
					}
					if got := readSlot(t, store, a, slots[i]); !bytes.Equal(got, pageOf(i, 1)) {
						t.Errorf("the parent's slot of staged page %d was written: %x...", i, got[:16])
					}
				case want[i].State() == pager.Remote || want[i] == pager.Page(0).With(pager.Resident):
					if cslots[i] != slots[i] || a.SlotRefs(slots[i]) != 2 {
						t.Errorf("page %d (%v): child slot %d, refs %d; want the parent's %d, shared (2)", i, want[i], cslots[i], a.SlotRefs(slots[i]), slots[i])
					}
				default:
					if cslots[i] != 0 {
						t.Errorf("page %d (%v): child slot %d, want none", i, want[i], cslots[i])
					}
				}
			}
		})
	}

	// Every server gone at the fork: the staged pages cannot be written,
	// so they are Lost to the child (SIGBUS, never zeros) and the fork
	// says so; their slots go back. Pages in the pool stay shared: their
	// loss shows when the child faults on them.
	t.Run("servers lost", func(t *testing.T) {
		store, a, slots := stagedForkSetup(t, parent)
		// New slots for the staged pages, on slabs the reservoir already
		// holds, are taken before the servers go.
		for i := range store.Servers() {
			store.Lose(i)
		}
		child, cslots, err := a.ForkRegionForTest(slices.Clone(parent), slices.Clone(slots), maps.Clone(staged), true)
		if err == nil {
			t.Fatal("fork with every server lost: no error")
		}
		for i := range staged {
			if child[i] != pager.Page(0).With(pager.Lost) || cslots[i] != 0 {
				t.Errorf("staged page %d: child has %v slot %d, want Lost without a slot", i, child[i], cslots[i])
			}
		}
		if child[0] != pager.Page(0).With(pager.Remote) || cslots[0] != slots[0] {
			t.Errorf("page 0: child has %v slot %d, want Remote in the parent's slot %d", child[0], cslots[0], slots[0])
		}
	})
}

// stagedForkSetup returns a store of 2 servers with 16-page slabs, an
// agent over it, and a slot for each page of pages that the pool holds
// (Remote, clean Resident, Staged: the slot its write-back will use),
// each written with generation 1.
func stagedForkSetup(t *testing.T, pages []pager.Page) (*pagertest.Store, *pager.Agent, []pager.Slot) {
	t.Helper()
	store := pagertest.New(t, pagertest.Options{Servers: 2, SlabSize: 16 * 4096, SlabsPerServer: 8})
	a := startAgent(t, store, 1<<20)
	slots := make([]pager.Slot, len(pages))
	var want []int
	for i, p := range pages {
		if p.State() == pager.Remote || p.State() == pager.Staged || p == pager.Page(0).With(pager.Resident) {
			want = append(want, i)
		}
	}
	got, err := a.AllocSlotsForTest(len(want))
	if err != nil {
		t.Fatal(err)
	}
	io, err := store.OpenIO()
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	ops := make([]remote.PageOp, 0, len(want))
	for k, i := range want {
		slots[i] = got[k]
		slab, off := a.SlotWhere(got[k])
		ops = append(ops, remote.PageOp{Slab: slab, Off: off, Buf: pageOf(i, 1)})
	}
	if err := io.Write(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
	}
	return store, a, slots
}

// pageOf is page i's contents in generation gen.
func pageOf(i int, gen uint64) []byte {
	b := make([]byte, 4096)
	for w := 0; w < len(b); w += 8 {
		binary.LittleEndian.PutUint64(b[w:], gen<<48|uint64(i)<<16|uint64(w/8))
	}
	return b
}

// readSlot reads the page in slot s.
func readSlot(t *testing.T, store *pagertest.Store, a *pager.Agent, s pager.Slot) []byte {
	t.Helper()
	io, err := store.OpenIO()
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	slab, off := a.SlotWhere(s)
	ops := []remote.PageOp{{Slab: slab, Off: off, Buf: make([]byte, 4096)}}
	io.Read(context.Background(), ops)
	if ops[0].Err != nil {
		t.Fatalf("reading slot %d: %v", s, ops[0].Err)
	}
	return ops[0].Buf
}
