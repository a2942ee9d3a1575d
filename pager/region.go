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
	wr    writeRate
	wa    writeAhead
	// mapped: slots is a mapping of the region's journal file
	// (journal.go), unmapped when the region goes.
	mapped bool
	// px: a proxy, a process's mapping of a shared memory segment
	// (shared.go), plen bytes long, with no page table (pages and slots
	// nil): its pages are the segment's owner's.
	px   *proxy
	plen uint64
	// pinned: not evicted (a shared memory segment being written back
	// into its file, shared.go)
	pinned bool
}

// writeRate estimates how often a page of a region installed clean from
// the pool is written while resident (a WP fault): when half are, pages
// prefetched into it are installed writable, dirty (readRef.write), which
// saves a WP fault per page at the cost of a write-back for the few that
// are evicted unwritten. The counts halve every writeWindow clean
// installs, so that the estimate follows the program's phases.
type writeRate struct {
	clean, wp uint32
	n         uint32 // pages asked about (likely): every probeEvery-th is installed clean
}

// writeAhead follows a stream of WP faults moving up or down through a
// region's resident pages (a buffer read, then overwritten in order;
// glibc's memmove copies large buffers from the end): each fault of the
// stream unprotects twice as many resident pages ahead as the last, up to
// maxWriteAhead, so the stream takes a few faults instead of one a page. A
// page unprotected ahead is dirty: a write-back when it is evicted, even if
// the stream stopped short of writing it.
type writeAhead struct {
	lo    int // the last run unprotected, [lo, lo+ahead)
	ahead int
}

// maxWriteAhead bounds the pages one WP fault unprotects.
const maxWriteAhead = 64

// run returns the pages [lo, lo+k) to unprotect for a WP fault on idx of a
// region of n pages: idx alone unless the fault continues the stream, at
// most a run's length past either end of the last run (pages dirty
// already take no fault), then a run from idx away from it. writable(q)
// says whether page q may be unprotected (resident, not being evicted or
// fetched); the run ends at the first that may not.
func (w *writeAhead) run(idx, n int, writable func(int) bool) (lo, k int) {
	lo, k = idx, 1
	slack := max(w.ahead, 8)
	want := min(2*w.ahead, maxWriteAhead)
	switch {
	case w.ahead == 0:
	case idx >= w.lo+w.ahead && idx < w.lo+w.ahead+slack:
		for k < want && idx+k < n && writable(idx+k) {
			k++
		}
	case idx < w.lo && idx >= w.lo-slack:
		for k < want && lo > 0 && writable(lo-1) {
			lo, k = lo-1, k+1
		}
	}
	w.lo, w.ahead = lo, k
	return lo, k
}

// probeEvery: while pages are installed writable, one in probeEvery is
// still installed clean, so that the estimate sees the program change.
const probeEvery = 8

const writeWindow = 512

func (w *writeRate) fetchedClean() {
	if w.clean++; w.clean >= writeWindow {
		w.clean, w.wp = w.clean/2, w.wp/2
	}
}

func (w *writeRate) written() { w.wp++ }

// likely reports whether a page to be installed now would probably be
// written before it is evicted (half of those installed clean were
// lately), but for the probes.
func (w *writeRate) likely() bool {
	w.n++
	return w.n%probeEvery != 0 && w.clean >= 64 && 2*w.wp >= w.clean
}

func (r *region) end() userfaultfd.Addr { return r.start + userfaultfd.Addr(r.len()) }

// len is r's length in bytes.
func (r *region) len() uint64 {
	if r.px != nil {
		return r.plen
	}
	return uint64(len(r.pages)) * pageSize
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
