package pager

import "rmem/userfaultfd"

// ForkRegionForTest runs the fork's copy of one region (forkRegion) on a
// client of a that has never served a process: the parent region holds
// pages, evicted to slabs (allocated from a's Store, 0 for none), and the
// pages its Staged ones hold in staging slots (a failed write-back). It
// returns the child's page table and slabs.
func (a *Agent) ForkRegionForTest(pages []Page, slabs []SlabID, staged map[int][]byte, forkEvents bool) ([]Page, []SlabID, error) {
	io, err := a.opts.Store.OpenIO()
	if err != nil {
		return nil, nil, err
	}
	defer io.Close()
	c := &client{a: a, log: a.log, io: io, staging: make([]byte, len(staged)*pageSize), slotOwner: make([]pageRef, len(staged))}
	if forkEvents {
		c.features = userfaultfd.FeatureEventFork
	}
	r := &region{id: 1, start: 1 << 30, pages: PageTable(pages), slabs: slabs}
	slot := 0
	for idx, data := range staged {
		copy(c.staging[slot*pageSize:], data)
		c.slotOwner[slot] = pageRef{r, idx}
		slot++
	}
	cr, err := c.forkRegion(r)
	return cr.pages, cr.slabs, err
}

// SlabShared reports whether slab id is shared by regions of a fork.
func (a *Agent) SlabShared(id SlabID) bool { return a.slabs.shared(id) }

// UnshareFixture is a client that has never served a process, holding one
// region over slabs shared with a fork, for driving unshares step by step.
type UnshareFixture struct {
	c *client
	r *region
}

// NewUnshareFixture returns a client whose region has pages over slabs,
// each slab shared once more, as a fork leaves them.
func (a *Agent) NewUnshareFixture(pages []Page, slabs []SlabID) (*UnshareFixture, error) {
	io, err := a.opts.Store.OpenIO()
	if err != nil {
		return nil, err
	}
	c := &client{a: a, log: a.log, io: io}
	r := &region{id: 1, start: 1 << 30, pages: PageTable(pages), slabs: slabs}
	c.regs.add(r)
	for _, id := range slabs {
		a.slabs.share(id)
	}
	return &UnshareFixture{c, r}, nil
}

// Evict offers pages as eviction victims (picked by CLOCK: busy) and
// returns those that may be evicted now.
func (f *UnshareFixture) Evict(pages ...int) ([]int, error) {
	victims := make([]Victim, len(pages))
	for i, p := range pages {
		f.r.pages[p] |= FlagBusy
		victims[i] = Victim{Table: 0, Page: p}
	}
	kept, err := f.c.unshareFor(victims)
	var out []int
	for _, v := range kept {
		f.r.pages[v.Page] &^= FlagBusy
		out = append(out, v.Page)
	}
	return out, err
}

// Step copies the next chunk of the unshare in progress and reports
// whether one is still in progress.
func (f *UnshareFixture) Step() bool {
	f.c.stepUnshare()
	return f.c.unsh != nil
}

// Pages is the region's page table, to read and change between steps.
func (f *UnshareFixture) Pages() []Page { return f.r.pages }

// Slabs is the slabs the region names.
func (f *UnshareFixture) Slabs() []SlabID { return f.r.slabs }

// Close removes the region, as an UNMAP does, and closes the client's IO.
func (f *UnshareFixture) Close() {
	f.c.removeRegion(f.r)
	f.c.io.Close()
}

// LetGo drops one reference to slab id, as the other side of a fork does
// when it exits, and frees it if it was the last.
func (a *Agent) LetGo(id SlabID) { a.freeSlabs(a.slabs.release([]SlabID{id})) }
