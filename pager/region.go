package pager

import (
	"sort"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// region is one range a client registered: its page table, the pool slot
// of each page (slots.go: 0 for none; a page has one while the pool holds
// its data: Remote, clean Resident, and Staged pages, whose write-back took
// it) and its prefetcher.
type region struct {
	id    uint64
	start userfaultfd.Addr
	pages PageTable
	slots []Slot
	kind  proto.Kind
	pf    *Prefetcher
	gone  bool // deleted while an eviction of its pages was in flight
	// mapped: slots is a mapping of the region's journal file
	// (journal.go), unmapped when the region goes.
	mapped bool
}

func (r *region) end() userfaultfd.Addr {
	return r.start + userfaultfd.Addr(uint64(len(r.pages))*pageSize)
}

func (r *region) addr(idx int) userfaultfd.Addr {
	return r.start + userfaultfd.Addr(uint64(idx)*pageSize)
}

// regions is a client's regions sorted by start, with the page tables in
// the same order for the CLOCK hand.
type regions struct {
	list   []*region
	tables []PageTable
}

// find returns the region containing a and the page index, or nil.
func (rs *regions) find(a userfaultfd.Addr) (*region, int) {
	i := sort.Search(len(rs.list), func(i int) bool { return rs.list[i].end() > a })
	if i < len(rs.list) && rs.list[i].start <= a {
		r := rs.list[i]
		return r, int(uint64(a-r.start) / pageSize)
	}
	return nil, 0
}

func (rs *regions) byID(id uint64) *region {
	for _, r := range rs.list {
		if r.id == id {
			return r
		}
	}
	return nil
}

// overlaps reports whether [start, end) overlaps a region.
func (rs *regions) overlaps(start, end userfaultfd.Addr) bool {
	for _, r := range rs.list {
		if start < r.end() && r.start < end {
			return true
		}
	}
	return false
}

func (rs *regions) add(r *region) {
	rs.list = append(rs.list, r)
	rs.sort()
}

func (rs *regions) remove(r *region) {
	for i, x := range rs.list {
		if x == r {
			rs.list = append(rs.list[:i], rs.list[i+1:]...)
			break
		}
	}
	rs.sort()
}

func (rs *regions) sort() {
	sort.Slice(rs.list, func(i, j int) bool { return rs.list[i].start < rs.list[j].start })
	rs.tables = rs.tables[:0]
	for _, r := range rs.list {
		rs.tables = append(rs.tables, r.pages)
	}
}
