package pager

import (
	"errors"

	"rmem/pager/remote"
)

// Relocation: when the pool's freed slots are scattered over many slabs,
// the reservoir drains the emptiest slab (slots.go, maybeDrainLocked) and
// every loop moves its pages out of it, a batch per pass of the loop, so
// that faults are served in between: a Remote page is read from its old
// slot and written to a new one; a clean resident page just lets its pool
// copy go (it is dirty from then on, written when it is evicted); a Staged
// page trades the slot its write-back will use. Busy pages (an eviction or
// a READ in flight) are left for the next sweep.

// relocScan bounds the page-table entries one pass of the loop looks at.
const relocScan = 1 << 16

// relocation is a loop's progress through a drain.
type relocation struct {
	gen     uint64 // the drain this client is done with
	cur     uint64 // the drain the cursor is for
	table   int    // cursor: region (index in c.regs.list) and page
	page    int
	skipped bool // pages were left in this sweep: another one follows
	ops     []remote.PageOp
	at      []pageRef
	slots   []Slot
}

// pending reports whether a drain is waiting for this client.
func (rl *relocation) pending(c *client) bool { return c.a.slots.gen.Load() != rl.gen }

// trim lets go of the share of the client's pool copies of clean resident
// pages that the pool asked for (slots.go, maybeTrimLocked): they become
// dirty, written to a slot again when evicted (letGo).
func (c *client) trim() {
	gen := c.a.slots.trim.gen.Load()
	if gen == c.room.trimSeen {
		return
	}
	c.room.trimSeen = gen
	c.letGo(int(max(c.st.pooled.Load()-c.st.remote.Load(), 0) * int64(c.a.slots.trim.share.Load()) / 1000))
}

// localTrimMin is the fewest copies an eviction short of slots lets go
// of (slotsFor): a batch's worth, so that the scan is not made for every
// batch, and no more (each copy let go is a write when its page is
// evicted: see trimFloor).
const localTrimMin = maxEvictBatch

// letGo makes up to want of the client's clean resident pages dirty,
// letting go of their pool copies, and returns how many it did. Recently
// referenced pages go first: they are the likeliest to stay resident
// until then. A slot a fork's other side names too is kept: letting go of
// it frees nothing.
func (c *client) letGo(want int) int {
	done := 0
	sharing := c.a.slots.sharing() // else no slot needs a look (and a lock) of its own
	for pass := 0; pass < 2 && want > 0; pass++ {
		for _, r := range c.regs.list {
			for idx, p := range r.pages {
				if want == 0 {
					break
				}
				if p.State() == Resident && p&(FlagBusy|FlagFetch|FlagDirty) == 0 && r.slots[idx] != 0 &&
					(pass == 1 || p.Has(FlagRef)) && (!sharing || !c.a.slots.shared(r.slots[idx])) {
					c.dirty(r, idx, p)
					want--
					done++
				}
			}
		}
	}
	return done
}

// relocate moves a batch of the client's pages out of the slab being
// drained, if any.
func (c *client) relocate() {
	rl := &c.room.reloc
	gen := c.a.slots.gen.Load()
	if gen == rl.gen {
		return
	}
	if c.a.slots.view.Load().drain < 0 || len(c.regs.list) == 0 {
		*rl = relocation{gen: gen, cur: gen, ops: rl.ops, at: rl.at, slots: rl.slots}
		return
	}
	if rl.ops == nil {
		rl.ops = make([]remote.PageOp, 0, maxBatch)
		rl.at = make([]pageRef, 0, maxBatch)
		rl.slots = make([]Slot, maxBatch)
	}
	rl.ops, rl.at = rl.ops[:0], rl.at[:0]
	if rl.cur != gen { // a new drain: a sweep from the start
		rl.cur, rl.table, rl.page, rl.skipped = gen, 0, 0, false
	}
	if rl.table >= len(c.regs.list) {
		rl.table, rl.page = 0, 0
	}
	for scanned := 0; scanned < relocScan && len(rl.at) < maxBatch; scanned++ {
		r := c.regs.list[rl.table]
		if rl.page >= len(r.pages) {
			rl.table, rl.page = rl.table+1, 0
			if rl.table == len(c.regs.list) {
				if !rl.skipped {
					break // a whole sweep found nothing left to move
				}
				rl.table, rl.skipped = 0, false
			}
			continue
		}
		idx := rl.page
		rl.page++
		s := r.slots[idx]
		if s == 0 || !c.a.slots.draining(s) {
			continue
		}
		p := r.pages[idx]
		switch {
		case p&(FlagBusy|FlagFetch) != 0:
			rl.skipped = true
		case p.State() == Resident:
			c.dirty(r, idx, p) // its pool copy goes; written when evicted
		case p.State() == Remote || p.State() == Staged:
			rl.at = append(rl.at, pageRef{r, idx})
		}
	}
	moved := c.move(rl)
	if moved > 0 {
		c.a.slots.relocated(moved)
	}
	if len(rl.at) == 0 && rl.table == len(c.regs.list) && !rl.skipped {
		*rl = relocation{gen: gen, cur: gen, ops: rl.ops, at: rl.at, slots: rl.slots}
	}
	if rl.table >= len(c.regs.list) {
		rl.table = len(c.regs.list)
	}
}

// move gives the pages rl.at new slots: a Staged page's slot was never
// written (its write-back failed), so it only trades it; a Remote page is
// read from its old slot and written to the new one. It returns how many
// pages moved; the others are left for the next sweep (or Lost, when every
// replica of the old slot is gone).
func (c *client) move(rl *relocation) int {
	n := c.a.slots.alloc(rl.slots[:len(rl.at)])
	if n < len(rl.at) {
		rl.skipped = true // the pool is short: the rest waits
	}
	moved := 0
	rl.ops = rl.ops[:0]
	reads := rl.at[:0]
	var fresh []Slot
	for k, ref := range rl.at[:n] {
		if ref.entry().State() == Staged {
			c.setSlot(ref.r, ref.idx, rl.slots[k])
			moved++
			continue
		}
		slab, off := c.poolAt(ref)
		j := len(rl.ops)
		rl.ops = append(rl.ops, remote.PageOp{Slab: slab, Off: off, Buf: c.rd.buf(j, j+1)})
		reads = append(reads, ref)
		fresh = append(fresh, rl.slots[k])
	}
	if len(rl.ops) == 0 {
		return moved
	}
	c.io.Read(c.a.ctx, rl.ops)
	writes := rl.ops[:0]
	var wrote []int
	for j := range rl.ops {
		op := rl.ops[j]
		ref := reads[j]
		c.st.checksumErrors.Add(uint64(op.Corrupt))
		switch {
		case op.Err == nil:
			slab, off := c.a.slots.where(fresh[j])
			writes = append(writes, remote.PageOp{Slab: slab, Off: off, Buf: op.Buf})
			wrote = append(wrote, j)
		case errors.Is(op.Err, remote.ErrLost):
			c.set(ref.r, ref.idx, ref.entry().With(Lost))
			c.setSlot(ref.r, ref.idx, 0)
			c.a.slots.release(fresh[j])
		default:
			c.a.slots.release(fresh[j])
			rl.skipped = true
		}
	}
	c.io.Write(c.a.ctx, writes)
	for i, op := range writes {
		j := wrote[i]
		if op.Err != nil {
			c.a.slots.release(fresh[j])
			rl.skipped = true
			continue
		}
		c.setSlot(reads[j].r, reads[j].idx, fresh[j])
		moved++
	}
	return moved
}
