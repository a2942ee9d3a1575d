package loadgen

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	check := func(v uint64) {
		i := bucketOf(v)
		if i < 0 || i >= nBuckets {
			t.Fatalf("value %d: bucket %d of %d", v, i, nBuckets)
		}
		lo, w := bucketRange(i)
		if v < lo || v-lo >= w {
			t.Fatalf("value %d in bucket %d = [%d, %d+%d)", v, i, lo, lo, w)
		}
		if w > 1 && float64(w)/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d = [%d, +%d): wider than 1/%d", i, lo, w, subCount)
		}
	}
	for v := range uint64(5000) {
		check(v)
	}
	for range 100_000 {
		check(r.Uint64() >> r.UintN(64))
	}
	check(^uint64(0))
	// Consecutive buckets tile the values.
	for i := 1; i < nBuckets; i++ {
		lo0, w0 := bucketRange(i - 1)
		if lo, _ := bucketRange(i); lo != lo0+w0 {
			t.Fatalf("bucket %d starts at %d, bucket %d ends at %d", i, lo, i-1, lo0+w0)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Count() != 0 {
		t.Fatal("empty histogram: want zeros")
	}
	// 1 µs to 100 ms in 1 µs steps: the q-quantile is q·100 ms.
	const n = 100_000
	for i := 1; i <= n; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		want := q * n * float64(time.Microsecond)
		if got := float64(h.Quantile(q)); got < want*0.99 || got > want*1.01 {
			t.Errorf("p%v = %v, want %v ± 1%%", q*100, time.Duration(got), time.Duration(want))
		}
	}
	if h.Quantile(0) != time.Microsecond || h.Quantile(1) != n*time.Microsecond {
		t.Errorf("p0 %v, p100 %v: want the minimum and the maximum", h.Quantile(0), h.Quantile(1))
	}
	if h.Max() != n*time.Microsecond || h.Count() != n {
		t.Errorf("max %v, count %d", h.Max(), h.Count())
	}
	if m := h.Mean(); m != (n+1)*time.Microsecond/2 {
		t.Errorf("mean %v", m)
	}
	// Small values are exact.
	var s Histogram
	for _, v := range []time.Duration{3, 3, 3, 7, 200} {
		s.Record(v)
	}
	if s.Quantile(0.5) != 3 || s.Quantile(0.8) != 7 || s.Quantile(1) != 200 {
		t.Errorf("p50 %d p80 %d p100 %d, want 3 7 200", s.Quantile(0.5), s.Quantile(0.8), s.Quantile(1))
	}
}

func TestHistogramMerge(t *testing.T) {
	var a, b, all Histogram
	r := rand.New(rand.NewPCG(2, 2))
	for i := range 10_000 {
		d := time.Duration(r.ExpFloat64() * float64(50*time.Microsecond))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(&Histogram{})
	if m != all {
		t.Error("merged histograms differ from the one of all values")
	}
}
