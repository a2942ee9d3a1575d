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
