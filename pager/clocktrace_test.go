package pager

import (
	"container/heap"
	"testing"
)

// touch is one access of a page trace: page Page of table Table, a write
// or a read.
type touch struct {
	Victim
	write bool
}

// mergeSortTrace is the page trace of glibc's qsort of n pages of 4-byte
// keys (msort_with_tmp): the array in table 0, the temporary buffer of the
// same size in table 1. Each merge reads its two sorted halves as two
// streams and writes the buffer from its start; then the buffer is
// copied back over the array. A single page sorts in place. Random keys
// consume the two halves at about the same pace.
func mergeSortTrace(n int) []touch {
	var tr []touch
	for p := range n {
		tr = append(tr, touch{Victim{0, p}, true}) // the keys written
	}
	var sort func(off, n int)
	sort = func(off, n int) {
		if n <= 1 {
			tr = append(tr, touch{Victim{0, off}, true}, touch{Victim{1, 0}, true})
			return
		}
		n1 := n / 2
		sort(off, n1)
		sort(off+n1, n-n1)
		for k := range n {
			tr = append(tr, touch{Victim{0, off + k*n1/n}, false}, touch{Victim{0, off + n1 + k*(n-n1)/n}, false},
				touch{Victim{1, k}, true})
		}
		for k := range n {
			tr = append(tr, touch{Victim{1, k}, false}, touch{Victim{0, off + k}, true})
		}
	}
	sort(0, n)
	return tr
}

// traffic is the pages a policy moved: read back from the pool and
// written to it.
type traffic struct{ reads, writeBacks int }

func (t traffic) moved() int { return t.reads + t.writeBacks }

// clockTraffic replays tr through Clock under a budget of pages as the
// loop does: what the agent sees of an access is a fault in (a page not
// resident: hot if it comes back as a ghost) or the first write to a clean
// page (a WP fault), both of which reference the page; past the high
// watermark, victims are evicted down to the low one, the dirty ones
// written back. (replay_test.go's agentModel adds the prefetcher and
// eviction batches.)
func clockTraffic(tr []touch, tables, pages, budget int) traffic {
	tabs := make([]PageTable, tables)
	for i := range tabs {
		tabs[i] = make(PageTable, pages)
	}
	w := WatermarksFor(budget)
	victims := make([]Victim, budget)
	var c Clock
	var t traffic
	resident := 0
	for _, a := range tr {
		p := &tabs[a.Table][a.Page]
		switch p.State() {
		case Resident:
			if a.write && !p.Has(FlagDirty) {
				*p |= FlagDirty | FlagRef
			}
			continue
		case Remote:
			t.reads++
		}
		*p = p.FaultedIn()
		if a.write {
			*p |= FlagDirty
		}
		resident++
		if need := w.ToEvict(resident, 0); need > 0 {
			n := c.Victims(tabs, victims[:need])
			for _, v := range victims[:n] {
				q := &tabs[v.Table][v.Page]
				if q.Has(FlagDirty) {
					t.writeBacks++
				}
				*q = (*q &^ FlagBusy).Evicted(Remote)
			}
			resident -= n
		}
	}
	return t
}

// optTraffic replays tr under Belady's policy (evict the resident page
// used again last), which sees every access and the future: the least
// any policy can move with capacity pages resident.
func optTraffic(tr []touch, capacity int) traffic {
	next := make([]int, len(tr))
	last := map[Victim]int{}
	for i := len(tr) - 1; i >= 0; i-- {
		next[i] = len(tr)
		if j, ok := last[tr[i].Victim]; ok {
			next[i] = j
		}
		last[tr[i].Victim] = i
	}
	type state struct {
		resident, dirty, pooled bool
		next                    int
	}
	pages := map[Victim]*state{}
	h := &nextUse{}
	var t traffic
	resident := 0
	for i, a := range tr {
		s := pages[a.Victim]
		if s == nil {
			s = &state{}
			pages[a.Victim] = s
		}
		if !s.resident {
			if resident == capacity {
				for {
					e := heap.Pop(h).(useEntry)
					if v := pages[e.v]; v.resident && v.next == e.next {
						if v.dirty {
							t.writeBacks++
							v.pooled = true
						}
						v.resident, v.dirty = false, false
						break
					}
				}
				resident--
			}
			if s.pooled {
				t.reads++
			}
			s.resident = true
			resident++
		}
		s.dirty = s.dirty || a.write
		s.next = next[i]
		heap.Push(h, useEntry{a.Victim, next[i]})
	}
	return t
}

type useEntry struct {
	v    Victim
	next int
}

// nextUse is a max-heap of pages by next use (entries go stale when the
// page is used again; optTraffic skips those).
type nextUse []useEntry

func (h nextUse) Len() int           { return len(h) }
func (h nextUse) Less(i, j int) bool { return h[i].next > h[j].next }
func (h nextUse) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nextUse) Push(x any)        { *h = append(*h, x.(useEntry)) }
func (h *nextUse) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// TestClockMergeSortTraffic: on the page trace of a merge sort of twice
// its budget and more (glibc's qsort, which sorts through a buffer as big
// as the array: check 10's qsort sorts 128 MiB at 32 MiB local), the
// pages CLOCK moves stay close to the least any policy could move. This
// is what says that the qsort workload's paging is not a victim-policy
// problem (Belady's optimum, which knows the future, moves ~25% fewer
// pages), and it fails if a change to the policy makes it much worse.
func TestClockMergeSortTraffic(t *testing.T) {
	const pages = 8192 // 32 MiB of keys, 32 MiB of buffer
	budget := pages / 4
	tr := mergeSortTrace(pages)
	clock := clockTraffic(tr, 2, pages, budget)
	opt := optTraffic(tr, WatermarksFor(budget).High)
	t.Logf("%d accesses to %d pages at a budget of %d: CLOCK read back %d, wrote back %d; Belady's optimum %d, %d (CLOCK moves %.2fx)",
		len(tr), 2*pages, budget, clock.reads, clock.writeBacks, opt.reads, opt.writeBacks, float64(clock.moved())/float64(opt.moved()))
	if opt.moved() == 0 || clock.moved() < opt.moved() {
		t.Fatalf("CLOCK moved %d pages, the optimum %d: the replay is wrong", clock.moved(), opt.moved())
	}
	if float64(clock.moved()) > 1.5*float64(opt.moved()) {
		t.Errorf("CLOCK moved %d pages, %.2fx the optimum's %d: want at most 1.5x", clock.moved(), float64(clock.moved())/float64(opt.moved()), opt.moved())
	}
}
