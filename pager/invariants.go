package pager

import (
	"fmt"
	"os"
	"sync"
)

// Checks of the loop's own state, for tests: a slot left owned, a flag
// left set or a count that drifted is a lost write or a wrong read later,
// far from its cause. With checkInvariants set, the loop checks after each
// batch of READs and each eviction batch, and panics at the first thing
// wrong, naming it. The pager's tests set it (export_test.go); an agent
// run with RMEM_CHECK_STATE=1 in its environment does too, for hunting a
// bug with real programs (each check reads every page table: slow).

// checkInvariants turns the checks on.
var checkInvariants = os.Getenv("RMEM_CHECK_STATE") == "1"

// checkState panics if checkInvariants is set and the client's state is
// not what it must be between batches: evicted says an eviction batch was
// just finished (the staging slots of its victims given back).
func (c *client) checkState(evicted bool) {
	if !checkInvariants {
		return
	}
	if err := c.strayState(evicted); err != nil {
		panic(fmt.Sprintf("pager: client %d: %v", c.id, err))
	}
}

// strayState returns what is wrong with the client's state, or nil.
func (c *client) strayState(evicted bool) error {
	if evicted {
		// Between eviction batches only a Staged page, whose write-back
		// is retried from its slot, owns a staging slot.
		for s, o := range c.ev.stageOwner {
			if o.r != nil && !o.r.gone && o.entry().State() != Staged {
				return fmt.Errorf("staging slot %d kept for page %d, %s", s, o.idx, o.entry().State())
			}
		}
	}
	for s, o := range c.sample.owner {
		if o.r != nil && !o.r.gone && (o.entry().State() != Remote || !o.entry().Has(FlagSampled)) {
			return fmt.Errorf("sample slot %d kept for page %d, %s (entry %#x): only a Remote page held back keeps one", s, o.idx, o.entry().State(), uint16(o.entry()))
		}
	}
	var resident, remote, pooled int64
	seen := slotSets.Get().(*slotSet)
	defer slotSets.Put(seen)
	seen.clear()
	for _, r := range c.regs.list {
		if r.px != nil {
			continue
		}
		for idx, p := range r.pages {
			st, slot := p.State(), r.slots[idx]
			switch {
			case p.Has(FlagFetch):
				return fmt.Errorf("page %d (%s) fetched outside a batch of READs", idx, st)
			case p.Has(FlagBusy) && !c.ev.evictBusy:
				return fmt.Errorf("page %d (%s) busy with no eviction in flight", idx, st)
			case p.Has(FlagSampled) && st != Remote:
				return fmt.Errorf("page %d (%s) held back but not remote", idx, st)
			case st == Remote && slot == 0:
				return fmt.Errorf("page %d remote with no pool slot", idx)
			case st == Staged && c.ev.stageOf(r, idx) < 0:
				return fmt.Errorf("page %d staged with no staging slot", idx)
			case (st == Absent || st == Lost) && slot != 0:
				return fmt.Errorf("page %d %s with pool slot %d", idx, st, slot)
			}
			if slot != 0 {
				if !seen.add(slot) {
					return fmt.Errorf("pool slot %d named twice, by page %d and another", slot, idx)
				}
				pooled++
			}
			switch st {
			case Resident:
				resident++
			case Remote, Staged:
				remote++
			}
		}
	}
	if got := c.st.resident.Load(); got != resident {
		return fmt.Errorf("%d pages counted resident, %d are", got, resident)
	}
	if got := c.st.remote.Load(); got != remote {
		return fmt.Errorf("%d pages counted remote, %d are", got, remote)
	}
	if got := c.st.pooled.Load(); got != pooled {
		return fmt.Errorf("%d pool slots counted, %d named", got, pooled)
	}
	return nil
}

// slotSet is a set of pool slots, a bit each, kept from one check to the
// next in slotSets (no allocation per check).
type slotSet []uint64

// slotSets keeps the checks' sets between checks (loops check at once).
var slotSets = sync.Pool{New: func() any { return new(slotSet) }}

func (s *slotSet) clear() { clear(*s) }

// add adds slot to the set and reports whether it was not in it.
func (s *slotSet) add(slot Slot) bool {
	w, b := int(slot/64), uint64(1)<<(slot%64)
	if w >= len(*s) {
		*s = append(*s, make([]uint64, w+1-len(*s))...)
	}
	if (*s)[w]&b != 0 {
		return false
	}
	(*s)[w] |= b
	return true
}
