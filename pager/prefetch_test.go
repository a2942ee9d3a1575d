package pager

import (
	"math/rand"
	"testing"
)

// simulate runs an access stream over pages [0, limit) through a Prefetcher
// as the fault loop would: only accesses to non-resident pages fault, and a
// fault makes its page and the prefetched pages resident. It returns the
// number of faults and of pages prefetched but never accessed.
func simulate(p *Prefetcher, stream []int64, limit int64) (faults, wasted int) {
	resident := map[int64]bool{}
	prefetched := map[int64]bool{}
	out := make([]int64, 64)
	for _, pg := range stream {
		if resident[pg] {
			delete(prefetched, pg)
			continue
		}
		faults++
		resident[pg] = true
		n := p.Fault(pg, limit, out)
		for _, q := range out[:n] {
			if !resident[q] {
				resident[q] = true
				prefetched[q] = true
			}
		}
	}
	return faults, len(prefetched)
}

func TestPrefetchSequential(t *testing.T) {
	const pages = 4096
	stream := make([]int64, pages)
	for i := range stream {
		stream[i] = int64(i)
	}
	p := NewPrefetcher(32, 64)
	faults, wasted := simulate(p, stream, pages)
	// With depth doubling to 64, a scan of 4096 pages faults about
	// 4096/65 times plus the ramp-up.
	if faults > pages/40 {
		t.Errorf("sequential scan of %d pages: %d faults, want prefetch to absorb most", pages, faults)
	}
	if wasted > 64 {
		t.Errorf("wasted %d prefetched pages on a pure scan", wasted)
	}
	if p.Depth() != 64 {
		t.Errorf("depth %d, want it at the maximum on a pure scan", p.Depth())
	}
}

func TestPrefetchStrided(t *testing.T) {
	// 3, -1, -7: local streams; 100 and -300: longer than any stream's
	// first reach, found by the far stream.
	for _, stride := range []int64{3, -1, -7, 100, -300} {
		var stream []int64
		const limit = 300 * 8192
		start := int64(0)
		if stride < 0 {
			start = limit - 1
		}
		for pg := start; pg >= 0 && pg < limit && len(stream) < 8192; pg += stride {
			stream = append(stream, pg)
		}
		p := NewPrefetcher(32, 32)
		faults, _ := simulate(p, stream, limit)
		if faults > len(stream)/10 {
			t.Errorf("stride %d: %d faults for %d accesses", stride, faults, len(stream))
		}
	}
}

func TestPrefetchRandomStaysQuiet(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	stream := make([]int64, 20000)
	for i := range stream {
		stream[i] = rng.Int63n(1 << 20)
	}
	p := NewPrefetcher(32, 64)
	out := make([]int64, 64)
	issued := 0
	for _, pg := range stream {
		issued += p.Fault(pg, 1<<20, out)
	}
	if issued > len(stream)/100 {
		t.Errorf("uniform random faults issued %d prefetches over %d faults", issued, len(stream))
	}
}

func TestPrefetchNoiseTolerant(t *testing.T) {
	// A scan with one random access in every eight (two off-trend deltas)
	// still has a majority trend.
	rng := rand.New(rand.NewSource(2))
	p := NewPrefetcher(16, 8)
	out := make([]int64, 8)
	var pg int64 = 1000
	withTrend := 0
	for i := 0; i < 4000; i++ {
		if i%8 == 7 {
			p.Fault(rng.Int63n(1<<20), 1<<30, out)
			continue
		}
		pg++
		if p.Fault(pg, 1<<30, out) > 0 && out[0] == pg+1 {
			withTrend++
		}
	}
	t.Logf("trend on %d in-stream faults", withTrend)
	if withTrend < 2500 {
		t.Errorf("trend found on %d of 3500 in-stream faults", withTrend)
	}
}

func TestPrefetchBounds(t *testing.T) {
	p := NewPrefetcher(4, 16)
	out := make([]int64, 16)
	for pg := int64(0); pg < 10; pg++ {
		n := p.Fault(pg, 10, out)
		for _, q := range out[:n] {
			if q < 0 || q >= 10 {
				t.Fatalf("prefetch of page %d outside [0,10)", q)
			}
		}
	}
	if n := p.Fault(5, 10, out[:0]); n != 0 {
		t.Fatalf("wrote %d pages into an empty slice", n)
	}
}

func TestPrefetchNoAlloc(t *testing.T) {
	p := NewPrefetcher(32, 64)
	out := make([]int64, 64)
	var pg int64
	if n := testing.AllocsPerRun(1000, func() { pg++; p.Fault(pg, 1<<30, out) }); n != 0 {
		t.Fatalf("%v allocations per fault", n)
	}
}

// Two streams interleaved in one region, as a quicksort's partition
// pointers walk towards each other: each is followed on its own (one
// history for both saw deltas jumping between them, and no trend).
func TestPrefetchInterleavedStreams(t *testing.T) {
	const pages = 8192
	var stream []int64
	for i := int64(0); i < pages/2; i++ {
		stream = append(stream, i, pages-1-i)
	}
	p := NewPrefetcher(32, 64)
	faults, wasted := simulate(p, stream, pages)
	if faults > pages/20 {
		t.Errorf("two interleaved scans of %d pages: %d faults, want prefetch to absorb most", pages, faults)
	}
	if wasted > 2*64 {
		t.Errorf("wasted %d prefetched pages", wasted)
	}
	// And four threads scanning their quarters of one array.
	var four []int64
	for i := int64(0); i < pages/4; i++ {
		for q := int64(0); q < 4; q++ {
			four = append(four, q*pages/4+i)
		}
	}
	p = NewPrefetcher(32, 64)
	if faults, _ := simulate(p, four, pages); faults > pages/20 {
		t.Errorf("four interleaved scans: %d faults", faults)
	}
}
