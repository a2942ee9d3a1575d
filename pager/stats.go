package pager

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// latencyBuckets are powers of two of nanoseconds: bucket i counts
// latencies in [2^(i-1), 2^i) ns (bucket 0: under 1 ns), up to ~34 s.
const latencyBuckets = 36

// Histogram is a fixed-bucket latency histogram safe for one writer and
// any number of readers, with no allocation.
type Histogram struct {
	b [latencyBuckets]atomic.Uint64
}

// Observe records d.
func (h *Histogram) Observe(d time.Duration) {
	i := 0
	if d > 0 {
		i = min(bits.Len64(uint64(d)), latencyBuckets-1)
	}
	h.b[i].Add(1)
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.b {
		n += h.b[i].Load()
	}
	return n
}

// Quantile returns the upper bound of the bucket holding quantile q (0..1),
// or 0 with no observations. It overstates by less than 2×.
func (h *Histogram) Quantile(q float64) time.Duration {
	var counts [latencyBuckets]uint64
	var n uint64
	for i := range h.b {
		counts[i] = h.b[i].Load()
		n += counts[i]
	}
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n-1)) + 1
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= rank {
			return time.Duration(uint64(1) << i)
		}
	}
	return time.Duration(uint64(1) << (latencyBuckets - 1))
}

// Buckets returns the upper bounds (seconds) and cumulative counts, for
// Prometheus.
func (h *Histogram) Buckets() (map[float64]uint64, uint64, float64) {
	m := make(map[float64]uint64, latencyBuckets)
	var cum uint64
	var sum float64
	for i := range h.b {
		c := h.b[i].Load()
		cum += c
		ub := float64(uint64(1)<<i) / 1e9
		m[ub] = cum
		sum += float64(c) * ub * 0.75 // bucket midpoint estimate
	}
	return m, cum, sum
}

// counters are a client's statistics, written by its loop only.
type counters struct {
	faults, zeroFills, remoteReads, wpFaults, held atomic.Uint64
	evictions, writeBacks, lost, retries, waits    atomic.Uint64
	prefetchIssued, prefetchHits, prefetchWasted   atomic.Uint64
	resident, remote, pooled, regions              atomic.Int64
	noRoomSince                                    atomic.Int64 // unix ns; 0: eviction has pool slots
	latency                                        Histogram
}

// ClientStats is a snapshot of one client process's paging.
type ClientStats struct {
	ID            uint64 `json:"id"`
	PID           int    `json:"pid"`
	UID           uint32 `json:"uid"` // the process's user
	Regions       int    `json:"regions"`
	ResidentBytes uint64 `json:"resident_bytes"`
	// RemoteBytes: pages out of the process, in the pool (or staged on
	// their way there).
	RemoteBytes uint64 `json:"remote_bytes"`
	// PooledBytes: the pool slots the process names: its remote pages and
	// the clean resident ones whose pool copy is kept (evicted again
	// without a write). Slots shared with a fork count for both sides.
	PooledBytes uint64 `json:"pooled_bytes"`
	BudgetBytes uint64 `json:"budget_bytes"`
	// Faults counts MISSING faults served (zero fills, remote reads,
	// staged copies, poisons); WPFaults counts writes to clean pages.
	Faults      uint64        `json:"faults"`
	ZeroFills   uint64        `json:"zero_fills"`
	RemoteReads uint64        `json:"remote_reads"`
	WPFaults    uint64        `json:"wp_faults"`
	Held        uint64        `json:"held"` // faults that waited for an eviction
	FaultP50    time.Duration `json:"fault_p50_ns"`
	FaultP99    time.Duration `json:"fault_p99_ns"`
	Evictions   uint64        `json:"evictions"`
	WriteBacks  uint64        `json:"write_backs"`
	Lost        uint64        `json:"lost"` // pages poisoned: every replica gone
	Retries     uint64        `json:"retries"`
	// BudgetWaits counts faults that waited because the process was past
	// its budget and no eviction could run (the pool had no room for its
	// dirty pages); NoRoomSince is when its evictions began to lack pool
	// slots (zero: they have them).
	BudgetWaits uint64    `json:"budget_waits"`
	NoRoomSince time.Time `json:"no_room_since,omitzero"`
	// Prefetch: pages fetched ahead. Hits and Wasted count a sample of
	// them (1 in 256 held back until touched, sample.go): touched, or not
	// before its slot was needed again. Their ratio estimates the hit
	// rate.
	PrefetchIssued uint64 `json:"prefetch_issued"`
	PrefetchHits   uint64 `json:"prefetch_hits"`
	PrefetchWasted uint64 `json:"prefetch_wasted"`
	// Exited marks the final stats of a client whose process has gone.
	Exited bool `json:"exited,omitempty"`
}

// PrefetchHitRate returns hits / (hits + wasted) of the sampled prefetched
// pages, or 0.
func (s ClientStats) PrefetchHitRate() float64 {
	if s.PrefetchHits+s.PrefetchWasted == 0 {
		return 0
	}
	return float64(s.PrefetchHits) / float64(s.PrefetchHits+s.PrefetchWasted)
}

func (c *counters) snapshot(pageSize uint64) ClientStats {
	s := ClientStats{
		Regions:       int(c.regions.Load()),
		ResidentBytes: uint64(max(c.resident.Load(), 0)) * pageSize,
		RemoteBytes:   uint64(max(c.remote.Load(), 0)) * pageSize,
		PooledBytes:   uint64(max(c.pooled.Load(), 0)) * pageSize,
		Faults:        c.faults.Load(), ZeroFills: c.zeroFills.Load(), RemoteReads: c.remoteReads.Load(),
		WPFaults: c.wpFaults.Load(), Held: c.held.Load(),
		FaultP50: c.latency.Quantile(0.50), FaultP99: c.latency.Quantile(0.99),
		Evictions: c.evictions.Load(), WriteBacks: c.writeBacks.Load(), Lost: c.lost.Load(),
		Retries: c.retries.Load(), BudgetWaits: c.waits.Load(),
		PrefetchIssued: c.prefetchIssued.Load(), PrefetchHits: c.prefetchHits.Load(), PrefetchWasted: c.prefetchWasted.Load(),
	}
	if ns := c.noRoomSince.Load(); ns != 0 {
		s.NoRoomSince = time.Unix(0, ns)
	}
	return s
}
