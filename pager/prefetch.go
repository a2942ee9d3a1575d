package pager

// Prefetcher detects sequential and strided fault streams in one region and
// says which pages to fetch ahead of the next fault. It follows Leap
// (Al Maruf and Chowdhury, ATC'20): the trend is the majority delta among the
// most recent faults, found with the Boyer–Moore majority vote over a window
// that starts small and doubles up to the whole history, so that a new trend
// is picked up after a few faults and an old one survives some noise. The
// prefetch depth adapts to what the previous prefetch earned: it doubles
// while prefetched pages are used and halves when they are not.
//
// A Prefetcher is plain state with no locking and no allocation after New:
// the fault loop of its region owns it.
type Prefetcher struct {
	deltas   []int64 // ring of the last len(deltas) fault-to-fault deltas, in pages
	n        int     // deltas recorded so far, capped at len(deltas)
	next     int     // ring position of the next delta
	last     int64   // page index of the previous fault
	haveLast bool

	depth    int // pages to prefetch on the next trend hit
	minDepth int
	maxDepth int

	// Accounting of the last prefetch, to adapt depth.
	issued int   // pages issued by the last Fault
	stride int64 // the delta they were issued along
	used   int   // of which a later fault found resident or passed over

	stats PrefetchStats // settled windows (Issued counts every Fault)
}

// PrefetchStats counts what prefetching did.
type PrefetchStats struct {
	Issued uint64 // pages prefetched
	Hits   uint64 // prefetched pages that were used before eviction
	Wasted uint64 // prefetched pages evicted or unmapped unused
}

// NewPrefetcher returns a prefetcher keeping history faults and prefetching
// between 1 and maxDepth pages ahead. history is rounded up to a power of
// two of at least 4.
func NewPrefetcher(history, maxDepth int) *Prefetcher {
	h := 4
	for h < history {
		h *= 2
	}
	if maxDepth < 1 {
		maxDepth = 1
	}
	return &Prefetcher{deltas: make([]int64, h), depth: 1, minDepth: 1, maxDepth: maxDepth}
}

// Trend returns the majority delta of the recent faults, if there is one.
// A zero delta (the same page faulting again) is never a trend.
func (p *Prefetcher) Trend() (int64, bool) {
	for w := 4; ; w *= 2 {
		if w > p.n {
			w = p.n
		}
		if d, ok := p.majority(w); ok && d != 0 {
			return d, true
		}
		if w >= p.n {
			return 0, false
		}
	}
}

// majority returns the strict-majority value among the last w deltas.
func (p *Prefetcher) majority(w int) (int64, bool) {
	if w == 0 {
		return 0, false
	}
	at := func(i int) int64 { // i-th most recent delta, i in [0, w)
		return p.deltas[(p.next-1-i+2*len(p.deltas))%len(p.deltas)]
	}
	var cand int64
	count := 0
	for i := 0; i < w; i++ {
		d := at(i)
		switch {
		case count == 0:
			cand, count = d, 1
		case d == cand:
			count++
		default:
			count--
		}
	}
	count = 0
	for i := 0; i < w; i++ {
		if at(i) == cand {
			count++
		}
	}
	return cand, count > w/2
}

// Fault records a fault on page and fills out with the pages to prefetch
// (page indexes within [0, limit)), returning how many it wrote. out bounds
// the depth; the caller skips pages that are already resident or in flight.
func (p *Prefetcher) Fault(page, limit int64, out []int64) int {
	if p.haveLast {
		if steps := p.credit(page); steps > 1 {
			// The stream touched the prefetched pages without faulting;
			// record those accesses as Leap's history would have seen them.
			for i := int64(0); i < min(steps, int64(len(p.deltas))); i++ {
				p.record(p.stride)
			}
		} else {
			p.record(page - p.last)
		}
	}
	p.last, p.haveLast = page, true
	p.adapt()

	d, ok := p.Trend()
	if !ok {
		p.issued, p.used = 0, 0 // settled by adapt above
		return 0
	}
	k := 0
	for i := 1; i <= p.depth && k < len(out); i++ {
		q := page + int64(i)*d
		if q < 0 || q >= limit {
			break
		}
		out[k] = q
		k++
	}
	p.issued, p.stride, p.used = k, d, 0
	p.stats.Issued += uint64(k)
	return k
}

// credit counts the pages of the last prefetch that the stream passed over
// on its way to page: they were accessed without faulting, so they were used.
// A fault that leaves the stream credits nothing, and the depth shrinks.
// It returns how many strides the fault is ahead of the previous one along
// that stream, or 0 when it is off the stream.
func (p *Prefetcher) credit(page int64) int64 {
	if p.issued == 0 || p.stride == 0 {
		return 0
	}
	steps := (page - p.last) / p.stride
	if steps <= 0 || (page-p.last)%p.stride != 0 || steps > int64(p.issued)+1 {
		return 0
	}
	p.used = int(min(steps-1, int64(p.issued)))
	return steps
}

func (p *Prefetcher) record(delta int64) {
	p.deltas[p.next] = delta
	p.next = (p.next + 1) % len(p.deltas)
	if p.n < len(p.deltas) {
		p.n++
	}
}

// Used records that a page prefetched by the last Fault was found in flight
// or resident by a fault (the stream caught up with its prefetch).
func (p *Prefetcher) Used() { p.used = min(p.used+1, p.issued) }

// adapt resizes the prefetch depth from the outcome of the previous prefetch.
func (p *Prefetcher) adapt() {
	p.stats.Hits += uint64(p.used)
	p.stats.Wasted += uint64(p.issued - p.used)
	switch {
	case p.issued == 0:
		return
	case p.used*2 >= p.issued:
		p.depth *= 2
	default:
		p.depth /= 2
	}
	p.depth = max(p.minDepth, min(p.depth, p.maxDepth))
}

// Stats returns what prefetching did so far, as the stream showed it: Hits
// are prefetched pages the stream passed over or caught in flight, Wasted
// the rest of each settled prefetch (the last one is not settled yet).
func (p *Prefetcher) Stats() PrefetchStats { return p.stats }

// Depth returns the current prefetch depth.
func (p *Prefetcher) Depth() int { return p.depth }
