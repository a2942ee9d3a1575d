package pager

// Prefetcher detects sequential and strided fault streams in one region and
// says which pages to fetch ahead of the next fault. It follows Leap
// (Al Maruf and Chowdhury, ATC'20) per stream: the trend is the majority
// delta among the most recent faults, found with the Boyer–Moore majority
// vote over a window that starts small and doubles up to the whole
// history, so that a new trend is picked up after a few faults and an old
// one survives some noise. The prefetch depth adapts to what the previous
// prefetch earned: it doubles while prefetched pages are used and halves
// when they are not.
//
// Unlike Leap, which keeps one history per process, it follows up to
// maxStreams local streams in a region at once: a fault joins the stream
// whose last fault is nearest, within that stream's reach (where its next
// fault would come). Interleaved streams (a quicksort's two partition
// pointers walking towards each other, threads scanning parts of one
// array, a merge of two runs) then each show their own trend instead of
// drowning it in deltas that jump between them. A fault no local stream
// claims is a jump: it starts a local stream in place of the one idle
// longest, and goes to the far stream, which sees every jump, so that a
// stride too long for any reach (a column walk of a large matrix) is
// still found there, as one history found it.
//
// A Prefetcher is plain state with no locking and no allocation after New:
// the fault loop of its region owns it.
type Prefetcher struct {
	streams [maxStreams]stream
	idle    [maxStreams]uint64 // fault count when each stream last faulted
	far     stream
	faults  uint64
	last    *stream // the stream of the last fault
}

// maxStreams bounds the local streams followed in one region.
const maxStreams = 4

// minReach is how far from a stream's last fault a fault may be and still
// belong to it, at the least (a stream's reach grows with its prefetch
// depth and stride: its next fault comes past what it prefetched).
const minReach = 16

// NewPrefetcher returns a prefetcher keeping history faults per stream and
// prefetching between 1 and maxDepth pages ahead. history is rounded up
// to a power of two of at least 4.
func NewPrefetcher(history, maxDepth int) *Prefetcher {
	p := &Prefetcher{far: newStream(history, maxDepth)}
	for i := range p.streams {
		p.streams[i] = newStream(history, maxDepth)
	}
	p.last = &p.far
	return p
}

// Fault records a fault on page and fills out with the pages to prefetch
// (page indexes within [0, limit)), returning how many it wrote. out bounds
// the depth; the caller skips pages that are already resident or in flight.
func (p *Prefetcher) Fault(page, limit int64, out []int64) int {
	p.faults++
	if i := p.near(page); i >= 0 {
		p.idle[i], p.last = p.faults, &p.streams[i]
		return p.last.fault(page, limit, out)
	}
	i := p.oldest()
	p.streams[i].reset()
	p.streams[i].fault(page, limit, out[:0]) // its first fault: no trend yet
	p.idle[i], p.last = p.faults, &p.far
	return p.far.fault(page, limit, out)
}

// near returns the local stream whose last fault is nearest page within
// its reach, or -1.
func (p *Prefetcher) near(page int64) int {
	best, bestDist := -1, int64(0)
	for i := range p.streams {
		s := &p.streams[i]
		if !s.haveLast {
			continue
		}
		d := page - s.last
		if d < 0 {
			d = -d
		}
		if d <= s.reach() && (best < 0 || d < bestDist) {
			best, bestDist = i, d
		}
	}
	return best
}

// oldest returns an unused local stream, or the one idle longest.
func (p *Prefetcher) oldest() int {
	old := 0
	for i := range p.streams {
		if !p.streams[i].haveLast {
			return i
		}
		if p.idle[i] < p.idle[old] {
			old = i
		}
	}
	return old
}

// Stats returns what prefetching did so far, summed over the streams.
func (p *Prefetcher) Stats() PrefetchStats {
	st := p.far.stats
	for i := range p.streams {
		s := p.streams[i].stats
		st.Issued += s.Issued
		st.Hits += s.Hits
		st.Wasted += s.Wasted
	}
	return st
}

// Depth returns the prefetch depth of the stream of the last fault.
func (p *Prefetcher) Depth() int { return p.last.depth }

// stream is one fault stream's Leap state.
type stream struct {
	deltas   []int64 // ring of the last len(deltas) fault-to-fault deltas, in pages
	n        int     // deltas recorded so far, capped at len(deltas)
	next     int     // ring position of the next delta
	last     int64   // page index of the previous fault
	haveLast bool

	depth    int // pages to prefetch on the next trend hit
	minDepth int
	maxDepth int

	// Accounting of the last prefetch, to adapt depth.
	issued int   // pages issued by the last fault
	stride int64 // the delta they were issued along
	used   int   // of which a later fault found resident or passed over

	stats PrefetchStats // settled windows (Issued counts every fault)
}

// PrefetchStats counts what prefetching did.
type PrefetchStats struct {
	Issued uint64 // pages prefetched
	Hits   uint64 // prefetched pages that were used before eviction
	Wasted uint64 // prefetched pages evicted or unmapped unused
}

func newStream(history, maxDepth int) stream {
	h := 4
	for h < history {
		h *= 2
	}
	if maxDepth < 1 {
		maxDepth = 1
	}
	return stream{deltas: make([]int64, h), depth: 1, minDepth: 1, maxDepth: maxDepth}
}

// reset starts the stream over, keeping its history's storage and its
// settled stats.
func (p *stream) reset() {
	p.adapt() // settle the last window
	*p = stream{deltas: p.deltas, depth: 1, minDepth: p.minDepth, maxDepth: p.maxDepth, stats: p.stats}
}

// reach is how far from its last fault the stream's next fault may come:
// past the pages it prefetched along its stride, with some slack.
func (p *stream) reach() int64 {
	st := p.stride
	if st < 0 {
		st = -st
	}
	return max(minReach, 2*int64(p.issued+1)*max(st, 1))
}

// trend returns the majority delta of the recent faults, if there is one:
// two deltas at least. A zero delta (the same page faulting again) is never
// a trend.
func (p *stream) trend() (int64, bool) {
	if p.n < 2 {
		// One delta is no trend: a stream started by a stray fault
		// near another would prefetch along any delta at all.
		return 0, false
	}
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
func (p *stream) majority(w int) (int64, bool) {
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

// fault records a fault of this stream on page and fills out with the pages
// to prefetch, as Prefetcher.Fault.
func (p *stream) fault(page, limit int64, out []int64) int {
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

	d, ok := p.trend()
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
func (p *stream) credit(page int64) int64 {
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

func (p *stream) record(delta int64) {
	p.deltas[p.next] = delta
	p.next = (p.next + 1) % len(p.deltas)
	if p.n < len(p.deltas) {
		p.n++
	}
}

// adapt resizes the prefetch depth from the outcome of the previous prefetch.
func (p *stream) adapt() {
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
