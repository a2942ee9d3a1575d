package pager

import "rmem/pager/proto"

// PageState is where a page's data is. It is the low 3 bits of a Page.
type PageState uint8

const (
	// Absent: never written (or dropped): the next fault maps a zero page.
	Absent PageState = iota
	// Resident: mapped in the client.
	Resident
	// Remote: in the pool, at the page's derived slab address.
	Remote
	// Staged: copied out by the client into a staging slot and unmapped,
	// not yet in the pool (its write-back failed and is retried).
	Staged
	// Lost: it was in the pool and every replica is gone; poisoned.
	Lost
)

func (s PageState) String() string {
	switch s {
	case Absent:
		return "absent"
	case Resident:
		return "resident"
	case Remote:
		return "remote"
	case Staged:
		return "staged"
	case Lost:
		return "lost"
	}
	return "invalid"
}

// Page is one page-table entry: a PageState and flags in two bytes.
type Page uint16

const (
	stateMask Page = 0x07
	// FlagDirty: the resident page differs from its pool copy (or has none).
	FlagDirty Page = 1 << 3
	// FlagRef: referenced since the CLOCK hand last passed (fault in, WP
	// fault).
	FlagRef Page = 1 << 4
	// FlagBusy: an eviction is in flight (write-protected, EVICT sent, no
	// EVICTED yet). Faults on it are held until the eviction is done.
	FlagBusy Page = 1 << 5
	// FlagFetch: a READ for it is in the current batch.
	FlagFetch Page = 1 << 6
	// FlagSampled: a Remote page prefetched and held back in a sample
	// slot (sample.go): its next fault is a prefetch hit.
	FlagSampled Page = 1 << 7
	// FlagHot: a resident page that faulted back in while it was a ghost:
	// it was used while resident, where the agent cannot see reads. The
	// hand passes it over while hot pages are under their share (Clock).
	FlagHot Page = 1 << 8
	// FlagGhost: a page evicted since the hand last passed it. Brought
	// back before the hand comes round again (a fault, or a prefetch: a
	// stream back over pages it read a turn ago) it is hot; the hand
	// clears it.
	FlagGhost Page = 1 << 9
)

// State returns the page's state.
func (p Page) State() PageState { return PageState(p & stateMask) }

// With returns p with its state set to s, flags kept.
func (p Page) With(s PageState) Page { return p&^stateMask | Page(s) }

// Has reports whether all of f are set.
func (p Page) Has(f Page) bool { return p&f == f }

// FaultedIn returns p made resident (by a fault, or prefetched):
// referenced, and hot if it comes back before the hand has passed it since
// its eviction.
func (p Page) FaultedIn() Page {
	q := (p &^ FlagGhost).With(Resident) | FlagRef
	if p.Has(FlagGhost) {
		q |= FlagHot
	}
	return q
}

// Evicted returns p, a victim, as it leaves for state s (Remote, or
// Staged until its write-back is done): clean, not referenced, not hot,
// and a ghost until the hand comes round.
func (p Page) Evicted(s PageState) Page {
	return (p&^(FlagDirty|FlagRef|FlagHot) | FlagGhost).With(s)
}

// PageTable is a region's page table: one byte per page, indexed by page
// number within the region. It is plain state owned by one loop.
type PageTable []Page

// Count returns how many pages are in state s.
func (t PageTable) Count(s PageState) int {
	n := 0
	for _, p := range t {
		if p.State() == s {
			n++
		}
	}
	return n
}

// Watermarks are the eviction thresholds of a budget, in pages: eviction
// starts when resident pages exceed High and stops at Low.
type Watermarks struct {
	High, Low int
}

// WatermarksFor returns the watermarks of a budget of pages: High at 95%,
// or two eviction batches (proto.MaxEvictBatch) under the budget where that
// is more (a budget over 20 MiB), and Low 5% or a batch under High, at least
// one page apart so each eviction makes progress. A budget under 2 pages is
// treated as 2. The pages between High and the budget (plus its margin,
// budgetMargin) are the room faults and prefetches have while an eviction
// is in flight; more is memory the budget allows and the program goes
// without: at 96 MiB, 95% left 4.8 MiB unused, and the bench's Zipfian
// reads of 128 MiB took 1.10x the faults they take at two batches under
// (replayed as replay_test.go does, at full size).
func WatermarksFor(budget int) Watermarks {
	budget = max(budget, 2)
	step := min(budget*5/100, proto.MaxEvictBatch)
	high := max(budget*95/100, budget-2*proto.MaxEvictBatch)
	low := high - step
	if high >= budget {
		high = budget - 1
	}
	if low >= high {
		low = high - 1
	}
	return Watermarks{High: max(high, 1), Low: max(low, 0)}
}

// ToEvict returns how many pages to evict with resident pages resident (of
// which inFlight are already being evicted): none below High, else enough
// to come down to Low.
func (w Watermarks) ToEvict(resident, inFlight int) int {
	if resident-inFlight <= w.High {
		return 0
	}
	return resident - inFlight - w.Low
}

// Clock is the CLOCK hand over a client's page tables, with hot and cold
// pages (a CLOCK-Pro of one hand, with the refault for the test period).
// A page is a victim when the hand finds it resident, not busy, not
// referenced and not hot; a referenced page loses its reference bit and is
// passed over (its second chance); a hot page is passed over while hot
// pages are at most hotPercent of the resident pages the hand passed in its
// last turn, and made cold when they are more.
//
// Why: the kernel tells a user-space pager nothing about reads of resident
// pages (no accessed bits, no page_idle on these kernels), only faults in
// and writes (WP faults), so a plain CLOCK over those is FIFO: every page is
// evicted within two turns of the hand however hot. The one read the agent
// sees is the refault: a page evicted that faults back before the hand has
// come round to it again (FlagGhost, then FlagHot) was in use while it was
// resident. Taking a page away to see whether it comes back is the only
// reference sampling user space has here, and an eviction is such a sample
// already, at no extra cost (docs/pager.md, Eviction: in the replay of
// replay_test.go, sampling pages beyond the victims costs more faults than
// it saves on all but one trace). Hot pages are kept while cold ones
// (faulted in once, or not back within a turn) are there to evict, as in
// 2Q, ARC, CLOCK-Pro and S3-FIFO: a scan through cold pages does not push
// the hot set out.
type Clock struct {
	Table int // index of the table the hand is in
	Page  int // next page to look at

	hotPct int // hot pages' share of the resident ones, in percent (0: hotPercent)
	// The hand's count of the resident and the hot pages it passed in
	// this turn, and whether hot pages were over their share in the last.
	turnResident, turnHot int
	overHot               bool
	lastHot               int // hot pages the hand passed in its last whole turn

	// Skip says which tables the hand passes over whole, their pages
	// not looked at (nil: none): a region whose pages may not be evicted
	// now (region.pinned).
	Skip func(table int) bool
}

func (c *Clock) skips(table int) bool { return c.Skip != nil && c.Skip(table) }

// Hot returns how many hot pages the hand passed in its last whole turn
// (0 before its first): the program's hot set as the hand last saw it.
func (c *Clock) Hot() int { return c.lastHot }

// hotPercent is the share of resident pages hot pages may keep: the rest
// is for cold pages to come in and show whether they come back (S3-FIFO's
// small queue, a tenth; here 3%). Chosen by the replay (replay_test.go):
// with hot pages taken only in the hand's third turn (Victims), 95% kept
// Redis GETs at 1.17x LRU's faults at 75% local, 97% at 1.11x.
const hotPercent = 97

// Reset moves the hand to the first page of the first table (the tables
// changed), keeping what it learnt of the hot share.
func (c *Clock) Reset() { c.Table, c.Page, c.turnResident, c.turnHot = 0, 0, 0, 0 }

// turn ends a turn of the hand over every table.
func (c *Clock) turn() {
	pct := c.hotPct
	if pct == 0 {
		pct = hotPercent
	}
	c.overHot = c.turnHot*100 > c.turnResident*pct
	c.lastHot = c.turnHot
	c.turnResident, c.turnHot = 0, 0
}

// Victims fills out with up to len(out) victims from tables, marks each
// FlagBusy (the caller evicts it, or clears the flag), and returns how many
// it found. It looks at each page at most three times, so it ends even
// when nothing is evictable: its first turn clears reference bits, its
// second takes the pages that lost theirs, and only its third takes hot
// pages too (every page it passed was referenced or hot, and is still
// hot). Taking hot pages in the second turn took them before the cold
// pages whose reference bit the first had cleared, whenever the hand's
// turn began among hot pages: a burst of faulted-in and prefetched pages,
// all referenced, cost the hot set its pages (TestCoreHotSetThroughScan
// failed 4 runs in 30 under -race). It clears FlagGhost on the pages it
// passes, and passes over the tables Skip names.
func (c *Clock) Victims(tables []PageTable, out []Victim) int {
	total := 0
	for i, t := range tables {
		if !c.skips(i) {
			total += len(t)
		}
	}
	if total == 0 || len(out) == 0 {
		return 0
	}
	if c.Table >= len(tables) {
		c.Reset()
	}
	n := 0
	for step := 0; step < 3*total && n < len(out); step++ {
		for c.Page >= len(tables[c.Table]) || c.skips(c.Table) { // ends: total counts a table not skipped
			c.Table, c.Page = (c.Table+1)%len(tables), 0
			if c.Table == 0 {
				c.turn()
			}
		}
		t := tables[c.Table]
		p := t[c.Page]
		switch {
		case p.State() != Resident:
			if p.Has(FlagGhost) {
				t[c.Page] = p &^ FlagGhost
			}
		case p&(FlagBusy|FlagFetch) != 0:
		case p.Has(FlagRef):
			c.count(p)
			t[c.Page] = p &^ FlagRef
		case p.Has(FlagHot) && step < 2*total:
			c.count(p)
			if c.overHot {
				t[c.Page] = p &^ FlagHot
			}
		default:
			c.turnResident++
			t[c.Page] = p | FlagBusy
			out[n] = Victim{Table: c.Table, Page: c.Page}
			n++
		}
		c.Page++
	}
	return n
}

func (c *Clock) count(p Page) {
	c.turnResident++
	if p.Has(FlagHot) {
		c.turnHot++
	}
}

// Victim is a page chosen by Clock: page Page of table Table.
type Victim struct {
	Table, Page int
}
