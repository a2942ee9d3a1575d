package pager

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Latencies are kept HDR-style (log-linear): values under 2^histBits ns
// each have a bucket of their own, and every power of two above is cut
// into 2^(histBits-1) equal buckets, so a bucket is at most 1/64 of its
// values wide and its midpoint is within 0.8% of any value in it, from
// 1 ns to ~34 s (the last bucket takes longer ones).
const (
	histBits    = 7
	histSub     = 1 << (histBits - 1)                   // buckets per power of two
	histOctaves = 36 - histBits                         // up to 2^36 ns
	histBuckets = 1<<histBits + histOctaves*histSub + 1 // the last: overflow
)

// Histogram is a latency histogram of ~1% precision (see histBits), safe
// for one writer and any number of readers, with no allocation.
type Histogram struct {
	b [histBuckets]atomic.Uint64
}

// histIndex is the bucket of v ns.
func histIndex(v uint64) int {
	n := bits.Len64(v)
	if n <= histBits {
		return int(v)
	}
	shift := n - histBits // >= 1: v>>shift is in [histSub, 2*histSub)
	i := 1<<histBits + (shift-1)*histSub + int(v>>shift) - histSub
	return min(i, histBuckets-1)
}

// histBounds returns bucket i's values [lo, hi].
func histBounds(i int) (lo, hi uint64) {
	if i < 1<<histBits {
		return uint64(i), uint64(i)
	}
	if i == histBuckets-1 {
		lo, _ = histBounds(i - 1)
		_, hi = histBounds(i - 1)
		return hi + 1, hi + 1
	}
	j := i - 1<<histBits
	shift := j/histSub + 1
	m := uint64(j%histSub + histSub)
	return m << shift, (m+1)<<shift - 1
}

// Observe records d.
func (h *Histogram) Observe(d time.Duration) {
	h.b[histIndex(uint64(max(d, 0)))].Add(1)
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.b {
		n += h.b[i].Load()
	}
	return n
}

// Quantile returns the midpoint of the bucket holding quantile q (0..1),
// within 0.8% of the observation there, or 0 with no observations.
func (h *Histogram) Quantile(q float64) time.Duration {
	return h.Quantiles(q)[0]
}

// Quantiles returns Quantile of each of qs (ascending) from one snapshot.
func (h *Histogram) Quantiles(qs ...float64) []time.Duration {
	var counts [histBuckets]uint64
	var n uint64
	for i := range h.b {
		counts[i] = h.b[i].Load()
		n += counts[i]
	}
	out := make([]time.Duration, len(qs))
	if n == 0 {
		return out
	}
	var seen uint64
	i := 0
	for k, q := range qs {
		rank := uint64(q*float64(n-1)) + 1
		for ; i < histBuckets; i++ {
			if seen+counts[i] >= rank {
				break
			}
			seen += counts[i]
		}
		lo, hi := histBounds(min(i, histBuckets-1))
		out[k] = time.Duration(lo + (hi-lo)/2)
	}
	return out
}

// promBounds are the bucket bounds the Prometheus metric shows (seconds):
// 1-2-5 steps from 1 µs to 10 s.
var promBounds = func() []float64 {
	var b []float64
	for ns := uint64(1000); ns <= 10e9; ns *= 10 {
		b = append(b, float64(ns)/1e9, float64(2*ns)/1e9, float64(5*ns)/1e9)
	}
	return b[:len(b)-2]
}()

// Buckets returns cumulative counts at promBounds (each fine bucket
// counted under the first bound its upper end fits), the count and the
// sum (of bucket midpoints), for Prometheus.
func (h *Histogram) Buckets() (map[float64]uint64, uint64, float64) {
	m := make(map[float64]uint64, len(promBounds))
	var cum uint64
	var sum float64
	j := 0
	for i := range h.b {
		c := h.b[i].Load()
		lo, hi := histBounds(i)
		for j < len(promBounds) && float64(hi)/1e9 > promBounds[j] {
			m[promBounds[j]] = cum
			j++
		}
		cum += c
		sum += float64(c) * float64(lo+(hi-lo)/2) / 1e9
	}
	for ; j < len(promBounds); j++ {
		m[promBounds[j]] = cum
	}
	return m, cum, sum
}

// prefetchCounters are a client's PrefetchCounts as its loop counts them.
type prefetchCounters struct {
	issued, hits, wasted, readahead atomic.Uint64
}

// counters are a client's statistics, written by its loop only.
type counters struct {
	faults, zeroFills, remoteReads, wpFaults, held atomic.Uint64
	evictions, writeBacks, lost, retries, waits    atomic.Uint64
	pf                                             prefetchCounters
	ringFaults, checksumErrors                     atomic.Uint64
	resident, remote, pooled, regions              atomic.Int64
	noRoomSince                                    atomic.Int64 // unix ns; 0: eviction has pool slots
	hot                                            atomic.Int64 // hot pages as the CLOCK hand last went round (Clock.Hot)
	stall                                          atomic.Int64 // ns the threads spent in misses (zero fills not counted), plus stallPerFault each
	latency                                        Histogram
	install                                        Histogram // of remote reads' installs (FaultLatency.InstallP50)
	ring                                           Histogram // ring faults' waits (FaultLatency.RingP50)
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
	// ColdBytes: resident pages not hot (Clock's FlagHot: evicted and
	// back before the hand came round) as the CLOCK hand last went round
	// them, what eviction takes first; all resident pages before the
	// hand's first turn.
	ColdBytes uint64 `json:"cold_bytes"`
	// Auto: the budget is steered by a slowdown target (Options.
	// MaxSlowdown), and StallPct is the share of wall time the process's
	// threads spent in misses over the controller's last step (percent).
	Auto     bool    `json:"auto,omitempty"`
	StallPct float64 `json:"stall_pct,omitempty"`
	// Stall is the time the process's threads spent in misses (first
	// touches not counted), as the agent measures it plus its estimate of
	// the trap and wake-up it does not see (rmem_agent_stall_seconds_total).
	Stall time.Duration `json:"stall_ns"`
	// Faults counts MISSING faults served (zero fills, remote reads,
	// staged copies, poisons); WPFaults counts writes to clean pages.
	Faults      uint64 `json:"faults"`
	ZeroFills   uint64 `json:"zero_fills"`
	RemoteReads uint64 `json:"remote_reads"`
	WPFaults    uint64 `json:"wp_faults"`
	Held        uint64 `json:"held"` // faults that waited for an eviction
	FaultLatency
	Evictions  uint64 `json:"evictions"`
	WriteBacks uint64 `json:"write_backs"`
	Trouble
	PrefetchCounts
	// RingFaults counts the faults that came through the fault ring
	// (served in the faulting thread's wait, not in the kernel's: ring.go),
	// of Faults and WPFaults.
	RingFaults uint64 `json:"ring_faults"`
	// Exited marks the final stats of a client whose process has gone.
	Exited bool `json:"exited,omitempty"`
}

// Trouble is what went wrong for a client's pages (its JSON is the
// client's own fields).
type Trouble struct {
	Lost uint64 `json:"lost"` // pages poisoned: every replica gone, or every copy bad
	// ChecksumErrors counts copies of the process's pages read from the
	// pool that failed their checksum (pager/slabio): each was read again
	// from another replica and rewritten there, or the page is lost
	// (SIGBUS, never wrong bytes).
	ChecksumErrors uint64 `json:"checksum_errors"`
	Retries        uint64 `json:"retries"`
	// BudgetWaits counts faults that waited because the process was past
	// its budget and no eviction could run (the pool had no room for its
	// dirty pages); NoRoomSince is when its evictions began to lack pool
	// slots (zero: they have them).
	BudgetWaits uint64    `json:"budget_waits"`
	NoRoomSince time.Time `json:"no_room_since,omitzero"`
}

// PrefetchCounts are a client's pages fetched ahead. Hits and Wasted count
// a sample of them (1 in 256 held back until touched, sample.go): touched,
// or not before its slot was needed again. Their ratio estimates the hit
// rate. ReadaheadHits counts faults on a stream's read-ahead marker
// (sample.go): served without a READ, they fetch the stream's next window
// while the program works through the rest of this one.
type PrefetchCounts struct {
	PrefetchIssued uint64 `json:"prefetch_issued"`
	PrefetchHits   uint64 `json:"prefetch_hits"`
	PrefetchWasted uint64 `json:"prefetch_wasted"`
	ReadaheadHits  uint64 `json:"readahead_hits"`
}

// FaultLatency is the quantiles of a client's fault latency (from the
// fault's read to its page installed), kept HDR-style to within 1%.
// InstallP50 is the median of its last step for a page read from the pool:
// the UFFDIO_COPY that maps the page and wakes the thread waiting for it.
// On a VM whose idle vCPUs halt that ioctl is most of a fault over shm:
// the wake-up it does is an IPI to the halted vCPU, paid by the agent
// (docs/pager.md, Fault path).
//
// RingP50 and RingP99 are, for the faults that came through the fault
// ring, the time their threads waited from their post to the agent's
// answer: a miss as the program sees it but for the trap into its SIGBUS
// handler and the install it makes itself.
type FaultLatency struct {
	FaultP50   time.Duration `json:"fault_p50_ns"`
	FaultP99   time.Duration `json:"fault_p99_ns"`
	FaultP999  time.Duration `json:"fault_p999_ns"`
	InstallP50 time.Duration `json:"install_p50_ns"`
	RingP50    time.Duration `json:"ring_p50_ns,omitempty"`
	RingP99    time.Duration `json:"ring_p99_ns,omitempty"`
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
	lat := c.latency.Quantiles(0.50, 0.99, 0.999)
	s := ClientStats{
		Regions:       int(c.regions.Load()),
		ResidentBytes: uint64(max(c.resident.Load(), 0)) * pageSize,
		RemoteBytes:   uint64(max(c.remote.Load(), 0)) * pageSize,
		ColdBytes:     uint64(max(c.resident.Load()-c.hot.Load(), 0)) * pageSize,
		PooledBytes:   uint64(max(c.pooled.Load(), 0)) * pageSize,
		Faults:        c.faults.Load(), ZeroFills: c.zeroFills.Load(), RemoteReads: c.remoteReads.Load(),
		WPFaults: c.wpFaults.Load(), Held: c.held.Load(),
		FaultLatency: FaultLatency{FaultP50: lat[0], FaultP99: lat[1], FaultP999: lat[2], InstallP50: c.install.Quantile(0.50)},
		RingFaults:   c.ringFaults.Load(),
		Stall:        time.Duration(c.stall.Load()),
		Evictions:    c.evictions.Load(), WriteBacks: c.writeBacks.Load(),
		Trouble: Trouble{Lost: c.lost.Load(), ChecksumErrors: c.checksumErrors.Load(),
			Retries: c.retries.Load(), BudgetWaits: c.waits.Load()},
		PrefetchCounts: PrefetchCounts{PrefetchIssued: c.pf.issued.Load(), PrefetchHits: c.pf.hits.Load(),
			PrefetchWasted: c.pf.wasted.Load(), ReadaheadHits: c.pf.readahead.Load()},
	}
	if s.RingFaults > 0 {
		rq := c.ring.Quantiles(0.50, 0.99)
		s.RingP50, s.RingP99 = rq[0], rq[1]
	}
	if ns := c.noRoomSince.Load(); ns != 0 {
		s.NoRoomSince = time.Unix(0, ns)
	}
	return s
}

// addCounters adds the counters of o (not its gauges or quantiles) to s.
func (s *ClientStats) addCounters(o ClientStats) {
	s.Faults += o.Faults
	s.ZeroFills += o.ZeroFills
	s.RemoteReads += o.RemoteReads
	s.WPFaults += o.WPFaults
	s.Evictions += o.Evictions
	s.WriteBacks += o.WriteBacks
	s.Lost += o.Lost
	s.ChecksumErrors += o.ChecksumErrors
	s.BudgetWaits += o.BudgetWaits
	s.PrefetchIssued += o.PrefetchIssued
	s.PrefetchHits += o.PrefetchHits
	s.PrefetchWasted += o.PrefetchWasted
	s.ReadaheadHits += o.ReadaheadHits
	s.RingFaults += o.RingFaults
	s.Stall += o.Stall
}
