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

// samples is a client's held-back prefetched pages.
type samples struct {
	buf   []byte // sampleSlots pages
	owner [sampleSlots]pageRef
	next  int    // slot to take next (round robin: the oldest)
	seen  uint64 // prefetched pages read, counting towards the next sample
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
	c.releaseSample(s)
	copy(c.sample.buf[s*pageSize:(s+1)*pageSize], c.fq.reads[k].Buf)
	ref := c.fq.readAt[k].pageRef
	ref.r.pages[ref.idx] = ref.entry()&^FlagFetch | FlagSampled
	c.sample.owner[s] = ref
	c.st.remoteReads.Add(1)
}

// releaseSample empties slot s: its page, if still held back, was not
// used.
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
		c.st.prefetchWasted.Add(1)
	}
}
