package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// Histogram buckets: values below 2*subCount are exact; above, each power
// of two is split into subCount buckets, so a bucket is at most 1/subCount
// (0.8%) of its values wide, and its midpoint is within 0.4% of any of them.
const (
	subBits  = 7
	subCount = 1 << subBits
	nBuckets = 2*subCount + (64-subBits-1)*subCount
)

// Histogram counts durations (nanoseconds) in log-linear buckets. Record
// does not allocate. The zero value is empty and ready; it is not safe for
// concurrent use (one per connection, merged at the end).
type Histogram struct {
	counts   [nBuckets]uint64
	n        uint64
	sum      uint64
	min, max uint64
}

func bucketOf(v uint64) int {
	if v < 2*subCount {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1 // v>>e is in [subCount, 2*subCount)
	return subCount + e*subCount + int(v>>e) - subCount
}

// bucketRange returns the values bucket i holds: [lo, lo+width).
func bucketRange(i int) (lo, width uint64) {
	if i < 2*subCount {
		return uint64(i), 1
	}
	e := i/subCount - 1
	return uint64(subCount+i%subCount) << e, 1 << e
}

// Record counts one duration (negative ones as zero).
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	h.max = max(h.max, v)
	h.n++
	h.sum += v
}

// Merge adds o's counts to h's.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count returns how many durations were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest duration recorded (exact).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the mean duration (exact).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of the durations recorded:
// the midpoint of the bucket holding the ceil(q·n)-th smallest, within the
// recorded minimum and maximum (exactly them for the first and the last);
// 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	switch rank { // known exactly
	case 1:
		return time.Duration(h.min)
	case h.n:
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			lo, w := bucketRange(i)
			return time.Duration(min(max(lo+w/2, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
