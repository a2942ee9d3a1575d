package pager

// Prefetch hits are measured on a sample. A user-space pager sees no
// reads of the pages it installed, so whether a prefetched page was used
// can only be inferred from where the stream faults next, and that fails
// for strides that wrap around (make demo's walk, modulo its heap: every
// prefetched page used, all counted as wasted). Instead, about one
// prefetched page in sampleEvery is held back: read like the others but
// kept in a sample slot, not installed. If the program touches it, it
// faults, the page is installed from the slot (no READ) and counted a hit;
// if its slot is needed for a later sample first, it is counted as wasted
// (and stays in the pool).
//
// The page held back is the last prefetched one of its batch, and its hit
// goes to the prefetcher as a fault there: a stream faults past the pages
// it prefetched anyway, so the sample moves that fault one page earlier
// instead of adding one (holding back a page in the middle of a window
// made a 128 MiB scan 17-20% slower). Last pages are the likeliest to go
// unused, so the estimate errs low.
const (
	sampleEvery = 256
	sampleSlots = 16
)

// Read-ahead markers use the same holding back, for another end: a
// stream's window of prefetched pages keeps one page, half a window from
// its far end, held back (as Linux marks a page PG_readahead). The
// program's fault there is served from the slot at once, without a READ,
// and prefetches the next window as a fault at the far end would: the
// stream's pages arrive while the program is still working through the
// last half of this window, instead of after it faulted past its end and
// waited for the whole window's READ (glibc's merge sort of 128 MiB at
// 32 MiB local over tcp: 11.97 -> 11.48 s, the mean of 4 runs each,
// fault p50 36-45 -> 18-24 µs). Unlike a sample held back mid-window
// (above), whose hit fetched next to nothing, a marker's hit fetches a
// whole window. Markers are not samples: their hits and their slots
// recycled unused are not counted as prefetch hits or waste.
const (
	markerSlots = 8
	// minMarkWindow is the smallest window that gets a marker: the
	// marker's fault costs the program about what a fault costs, worth
	// it only where it hides the READ of a window this size or more.
	minMarkWindow = 8
)

// samples is a client's held-back prefetched pages: sample slots, then
// marker slots.
type samples struct {
	buf   []byte // sampleSlots + markerSlots pages
	owner [sampleSlots + markerSlots]pageRef
	// end is, for each marker slot, the page its window ended at: a hit
	// prefetches as a fault there.
	end        [markerSlots]int
	next       int    // sample slot to take next (round robin: the oldest)
	nextMarker int    // marker slot to take next, counted from the first
	seen       uint64 // prefetched pages read, counting towards the next sample
}

// sampleNow reports whether the next prefetched page that arrived is held
// back.
func (s *samples) sampleNow() bool {
	s.seen++
	return s.seen%sampleEvery == 0
}

// holdSample keeps read k of the batch (a prefetched page that arrived)
// in a sample slot instead of installing it: the page stays Remote,
// marked FlagSampled.
func (c *client) holdSample(k int) {
	s := c.sample.next
	c.sample.next = (s + 1) % sampleSlots
	c.holdIn(s, k)
}

// holdMarker keeps read k of the batch, its window's marker, in a marker
// slot instead of installing it.
func (c *client) holdMarker(k int) {
	m := c.sample.nextMarker
	c.sample.nextMarker = (m + 1) % markerSlots
	c.sample.end[m] = c.rd.at[k].end
	c.holdIn(sampleSlots+m, k)
}

// holdIn keeps read k of the batch in slot s (sample or marker). A page
// that is not Remote any more (mapped meanwhile: another path served its
// fault while the READ was in the batch) is not held back: a slot must
// name only a Remote page, whose hit it serves.
func (c *client) holdIn(s, k int) {
	ref := c.rd.at[k].pageRef
	if ref.entry().State() != Remote {
		ref.r.pages[ref.idx] &^= FlagFetch
		c.st.remoteReads.Add(1)
		return
	}
	c.releaseSample(s)
	copy(c.sample.buf[s*pageSize:(s+1)*pageSize], c.rd.reads[k].Buf)
	ref.r.pages[ref.idx] = ref.entry()&^FlagFetch | FlagSampled
	c.sample.owner[s] = ref
	c.st.remoteReads.Add(1)
}

// releaseSample empties slot s: its page, if still held back, was not
// used (counted as wasted if s is a sample slot).
func (c *client) releaseSample(s int) {
	o := c.sample.owner[s]
	c.sample.owner[s] = pageRef{}
	if o.r == nil {
		return
	}
	// A page dropped since, or of a region removed (its entries zeroed),
	// has lost the flag.
	if p := o.entry(); p.State() == Remote && p.Has(FlagSampled) {
		o.r.pages[o.idx] = p &^ FlagSampled
		if s < sampleSlots {
			c.st.pf.wasted.Add(1)
		}
	}
}

// unsample empties the slot that holds ref's page back, if any: the page
// was dropped, and its bytes there are not its data any more. A slot left
// owned would serve a later hit on the page (sampleHit) bytes from before.
func (c *client) unsample(ref pageRef) {
	for s, o := range c.sample.owner {
		if o == ref {
			c.sample.owner[s] = pageRef{}
		}
	}
}
