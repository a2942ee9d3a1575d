package pager

// A page's entry and pool slot changed with the client's counts kept.

import (
	"rmem/pager/remote"
	"rmem/userfaultfd"
)

// freeRegions gives back the pool slots of regions: a client's that went
// away, or a fork copy no client adopted. A slot another region still
// names (shared across a fork) stays.
func (a *Agent) freeRegions(regs []*region) {
	for _, r := range regs {
		a.slots.release(r.slots...)
		clear(r.slots)
	}
}

// setSlot gives page idx of r the pool slot s (0: none) and releases the
// one it had, keeping the client's count of slots.
func (c *client) setSlot(r *region, idx int, s Slot) {
	old := r.slots[idx]
	if old == s {
		return
	}
	switch {
	case old == 0:
		c.st.pooled.Add(1)
	case s == 0:
		c.st.pooled.Add(-1)
	}
	r.slots[idx] = s
	if old != 0 {
		c.a.slots.release(old)
	}
}

// pageRef names a page: its region and its index there. The page's other
// names follow from it: its address in the program (addr), its page-table
// entry and pool slot (entry, slot), and through the slot pool the slab
// and offset of that slot (client.poolAt).
type pageRef struct {
	r   *region
	idx int
}

func (p pageRef) addr() userfaultfd.Addr { return p.r.addr(p.idx) }
func (p pageRef) entry() Page            { return p.r.pages[p.idx] }
func (p pageRef) slot() Slot             { return p.r.slots[p.idx] }

// poolAt returns the slab and byte offset of the page's pool slot.
func (c *client) poolAt(p pageRef) (remote.SlabID, uint64) { return c.a.slots.where(p.slot()) }

// dirty marks resident page idx of r written: its pool copy, if any, is
// stale, and its slot is released (the other side of a fork that shares
// it keeps its reference).
func (c *client) dirty(r *region, idx int, p Page) {
	c.set(r, idx, p|FlagDirty)
	c.setSlot(r, idx, 0)
}

// set changes a page's entry, keeping the resident and remote counts.
func (c *client) set(r *region, idx int, np Page) {
	op := r.pages[idx]
	if op.State() != np.State() {
		c.count(op.State(), -1)
		c.count(np.State(), +1)
	}
	r.pages[idx] = np
}

func (c *client) count(s PageState, d int64) {
	switch s {
	case Resident:
		c.st.resident.Add(d)
	case Remote, Staged:
		c.st.remote.Add(d)
	}
}

func pageRange(a userfaultfd.Addr) userfaultfd.Range {
	return userfaultfd.Range{Start: a, Len: pageSize}
}

// freeStage gives staging slot s back, and tells the journal.
func (c *client) freeStage(s int) {
	c.ev.freeStage(s)
	c.cj.stage(s, 0, 0, false)
}
