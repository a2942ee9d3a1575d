package traced

// region is a mapping of the program's that the agent pages.
type region struct {
	id         uint64
	start, end uint64
}

// regions is the tracer's copy of the program's regions, as the agent
// knows them (a region partly unmapped stays one: the agent's does). It
// may keep a region unmapped whole (munmap is not traced) until a new one
// takes its place: a REGION_ZAP of it then fails at the agent, harmlessly.
type regions struct {
	list   []region
	nextID uint64
}

// overlapping returns the regions that [start, end) meets.
func (rs *regions) overlapping(start, end uint64) []region {
	var out []region
	for _, r := range rs.list {
		if r.start < end && start < r.end {
			out = append(out, r)
		}
	}
	return out
}

// next returns a region [start, end) with a new id, not yet added.
func (rs *regions) next(start, end uint64) region {
	rs.nextID++
	return region{id: rs.nextID, start: start, end: end}
}

// put adds r.
func (rs *regions) put(r region) { rs.list = append(rs.list, r) }

// add is next and put.
func (rs *regions) add(start, end uint64) region {
	r := rs.next(start, end)
	rs.put(r)
	return r
}

// forgetOverlapping forgets the regions that meet [start, end): a new
// region the agent took there means they were unmapped whole.
func (rs *regions) forgetOverlapping(start, end uint64) {
	out := rs.list[:0]
	for _, r := range rs.list {
		if !(r.start < end && start < r.end) {
			out = append(out, r)
		}
	}
	rs.list = out
}

// forgetCovered forgets the regions [start, end) covers whole: the agent
// drops them at the uffd's UNMAP event.
func (rs *regions) forgetCovered(start, end uint64) {
	out := rs.list[:0]
	for _, r := range rs.list {
		if !(start <= r.start && r.end <= end) {
			out = append(out, r)
		}
	}
	rs.list = out
}

func (rs *regions) remove(id uint64) {
	out := rs.list[:0]
	for _, r := range rs.list {
		if r.id != id {
			out = append(out, r)
		}
	}
	rs.list = out
}

// clone returns a copy (a forked child's: the same ids, as the agent's
// copy of its parent's regions has).
func (rs *regions) clone() regions {
	return regions{list: append([]region(nil), rs.list...), nextID: rs.nextID}
}
