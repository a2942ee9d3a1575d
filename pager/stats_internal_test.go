package pager

import (
	"math/rand"
	"testing"
	"time"
)

// Every value falls in a bucket whose bounds hold it, and the bucket's
// midpoint is within 0.8% of it (exact under 2^histBits ns).
func TestHistogramBuckets(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, v := range append([]uint64{0, 1, 127, 128, 129, 255, 256, 1 << 20, 1<<36 - 1}, randValues(rng, 100000)...) {
		i := histIndex(v)
		lo, hi := histBounds(i)
		if v < lo || v > hi {
			t.Fatalf("%d ns in bucket %d [%d, %d]", v, i, lo, hi)
		}
		mid := float64(lo + (hi-lo)/2)
		if v > 0 && (mid-float64(v))/float64(v) > 0.008 || (float64(v)-mid)/float64(v) > 0.008 {
			t.Fatalf("%d ns: midpoint %.0f of bucket [%d, %d] is off by more than 0.8%%", v, mid, lo, hi)
		}
	}
	// Buckets tile the values in order, with no gap.
	for i := 1; i < histBuckets-1; i++ {
		_, hi := histBounds(i - 1)
		lo, _ := histBounds(i)
		if lo != hi+1 {
			t.Fatalf("bucket %d starts at %d, bucket %d ends at %d", i, lo, i-1, hi)
		}
	}
	if i := histIndex(1 << 40); i != histBuckets-1 {
		t.Errorf("2^40 ns in bucket %d, want the last (%d)", i, histBuckets-1)
	}
}

func randValues(rng *rand.Rand, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(rng.Int63n(1<<uint(rng.Intn(36)+1) + 1))
	}
	return out
}

// Quantiles of a known distribution come out within 1%: a 1.2x change
// shows (the power-of-two buckets before could not tell 17 µs from 30).
func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 10000; i++ {
		h.Observe(time.Duration(i) * 100 * time.Nanosecond) // 0.1 µs .. 1 ms, uniform
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {0.999, 999 * time.Microsecond}} {
		got := h.Quantile(c.q)
		if d := float64(got-c.want) / float64(c.want); d > 0.01 || d < -0.01 {
			t.Errorf("p%v = %v, want %v ±1%%", c.q*100, got, c.want)
		}
	}
	var a, b Histogram
	for range 1000 {
		a.Observe(20 * time.Microsecond)
		b.Observe(24 * time.Microsecond)
	}
	if pa, pb := a.Quantile(0.5), b.Quantile(0.5); float64(pb)/float64(pa) < 1.15 {
		t.Errorf("20 µs and 24 µs give p50 %v and %v: a 1.2x change does not show", pa, pb)
	}
	// Prometheus' buckets are cumulative at their bounds.
	m, n, sum := h.Buckets()
	near := func(got, want uint64) bool {
		return float64(got) >= 0.99*float64(want)-1 && float64(got) <= 1.01*float64(want)+1
	}
	if n != 10000 || !near(m[1e-3], 10000) || !near(m[5e-4], 5000) || !near(m[1e-6], 10) || m[10] != 10000 {
		t.Errorf("buckets %v, count %d", m, n)
	}
	if want := 10000 * 500e-6; sum < want*0.99 || sum > want*1.01 {
		t.Errorf("sum %v s, want about %v", sum, want)
	}
	var empty Histogram
	if q := empty.Quantiles(0.5, 0.99); q[0] != 0 || q[1] != 0 {
		t.Errorf("quantiles of nothing: %v", q)
	}
}
