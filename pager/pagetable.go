package pager

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

// Page is one page-table entry: a PageState and flags in one byte.
type Page uint8

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
)

// State returns the page's state.
func (p Page) State() PageState { return PageState(p & stateMask) }

// With returns p with its state set to s, flags kept.
func (p Page) With(s PageState) Page { return p&^stateMask | Page(s) }

// Has reports whether all of f are set.
func (p Page) Has(f Page) bool { return p&f == f }

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

// WatermarksFor returns the watermarks of a budget of pages: High at 95%
// and Low at 90%, and at least one page apart so each eviction makes
// progress. A budget under 2 pages is treated as 2.
func WatermarksFor(budget int) Watermarks {
	budget = max(budget, 2)
	high := budget * 95 / 100
	low := budget * 90 / 100
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

// Clock is the CLOCK hand over a client's page tables. A page is a victim
// when the hand finds it resident, not busy and not referenced; a
// referenced page loses its reference bit and is passed over (its second
// chance).
//
// Why CLOCK: the kernel tells a user-space pager nothing about reads of
// resident pages (no accessed bits, no page_idle on these kernels), only
// faults in and writes (WP faults). LRU approximations need accessed bits;
// CLOCK over the references we do see is the honest policy.
type Clock struct {
	Table int // index of the table the hand is in
	Page  int // next page to look at
}

// Victims fills out with up to len(out) victims from tables, marks each
// FlagBusy (the caller evicts it, or clears the flag), and returns how many
// it found. It looks at each page at most twice, so it ends even when
// nothing is evictable.
func (c *Clock) Victims(tables []PageTable, out []Victim) int {
	total := 0
	for _, t := range tables {
		total += len(t)
	}
	if total == 0 || len(out) == 0 {
		return 0
	}
	if c.Table >= len(tables) {
		c.Table, c.Page = 0, 0
	}
	n := 0
	for step := 0; step < 2*total && n < len(out); step++ {
		for c.Page >= len(tables[c.Table]) {
			c.Table, c.Page = (c.Table+1)%len(tables), 0
		}
		t := tables[c.Table]
		p := t[c.Page]
		if p.State() == Resident && p&(FlagBusy|FlagFetch) == 0 {
			if p.Has(FlagRef) {
				t[c.Page] = p &^ FlagRef
			} else {
				t[c.Page] = p | FlagBusy
				out[n] = Victim{Table: c.Table, Page: c.Page}
				n++
			}
		}
		c.Page++
	}
	return n
}

// Victim is a page chosen by Clock: page Page of table Table.
type Victim struct {
	Table, Page int
}
