package pager_test

import (
	"bytes"
	"slices"
	"testing"

	"rmem/pager"
	"rmem/pager/pagertest"
)

// An unshare copies a shared slab a chunk per pass of the loop, serving
// faults in between: what the region needs of the slab is copied as it is
// when each chunk is copied, whatever the pages did since the unshare
// began; dirty pages of the slab wait to be evicted until the copy is
// done; then the region names its copy and the shared slab loses a
// reference.
func TestUnshareInSteps(t *testing.T) {
	const spp = 256 // 1 MiB slabs: 4 chunks
	remote := pager.Page(0).With(pager.Remote)
	resident := pager.Page(0).With(pager.Resident)
	setup := func(t *testing.T) (*pagertest.Store, *pager.Agent, *pager.UnshareFixture, pager.SlabID) {
		store, a, slabs := stagedForkSetup(t, spp)
		pages := make([]pager.Page, spp)
		for i := range pages {
			pages[i] = remote
		}
		pages[10] = resident | pager.FlagDirty
		pages[100] = resident
		pages[200] = resident
		f, err := a.NewUnshareFixture(pages, slabs[:1])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.Close)
		return store, a, f, slabs[0]
	}
	held := func(store *pagertest.Store) int {
		_, n := store.Allocated()
		return n
	}

	t.Run("copied", func(t *testing.T) {
		store, a, f, old := setup(t)
		if kept, err := f.Evict(10, 100); err != nil || !slices.Equal(kept, []int{100}) {
			t.Fatalf("evicting dirty page 10 and clean page 100 of a shared slab: may evict %v (%v), want only the clean one", kept, err)
		}
		if f.Pages()[10].Has(pager.FlagBusy) || f.Slabs()[0] != old {
			t.Fatalf("the deferred victim is busy (%v) or the region names %d, not the shared %d, before the copy", f.Pages()[10], f.Slabs()[0], old)
		}
		steps := 1
		if !f.Step() {
			t.Fatal("the whole slab was copied in one step")
		}
		// Between chunks the loop serves faults and evictions.
		p := f.Pages()
		p[20] = resident          // copied already, faulted in since
		p[100] |= pager.FlagDirty // not copied yet, written since: no copy needed
		p[150] = resident         // not copied yet, faulted in since: copied clean
		p[200] = remote           // not copied yet, clean, dropped since: copied from the pool
		p[230] = resident | pager.FlagDirty
		if kept, err := f.Evict(230); err != nil || len(kept) != 0 {
			t.Fatalf("a dirty page of the slab being copied may be evicted: %v (%v)", kept, err)
		}
		for more := true; more; steps++ {
			more = f.Step()
		}
		if steps != 4 {
			t.Errorf("copied in %d steps, want 4 (a 256 KiB chunk each)", steps)
		}
		now := f.Slabs()[0]
		if now == old || a.SlabShared(old) {
			t.Fatalf("after the copy the region names %d (was %d), the old slab shared %v", now, old, a.SlabShared(old))
		}
		got := readSlab(t, store, now, spp)
		for i, pg := range f.Pages() {
			if pg.State() == pager.Remote || pg == resident {
				if !bytes.Equal(got[i], pageOf(i, 1)) {
					t.Errorf("page %d (%v) in the copy: %x..., want its data", i, pg, got[i][:16])
				}
			}
		}
		if kept, err := f.Evict(10, 230); err != nil || !slices.Equal(kept, []int{10, 230}) {
			t.Errorf("after the copy, dirty pages may evict %v (%v), want both", kept, err)
		}
		if n := held(store); n != 3 { // the fork's 2 and the copy
			t.Errorf("%d slabs held, want 3", n)
		}
	})

	// The other side exits during the copy: the slab is the region's
	// alone, the copy is dropped and freed, and dirty pages go to the slab.
	t.Run("let go", func(t *testing.T) {
		store, a, f, old := setup(t)
		if kept, _ := f.Evict(10); len(kept) != 0 || !f.Step() {
			t.Fatal("no unshare in progress")
		}
		if n := held(store); n != 3 {
			t.Fatalf("%d slabs held during the copy, want 3", n)
		}
		a.LetGo(old)
		if f.Step() {
			t.Fatal("the unshare goes on after the other side let go")
		}
		if f.Slabs()[0] != old || held(store) != 2 {
			t.Errorf("the region names %d (want %d), %d slabs held (want 2: the copy freed)", f.Slabs()[0], old, held(store))
		}
		if kept, err := f.Evict(10); err != nil || !slices.Equal(kept, []int{10}) {
			t.Errorf("dirty page 10 may evict %v (%v), want it", kept, err)
		}
	})
}
