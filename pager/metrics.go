package pager

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	// A client's series: its id and pid. The counters have one more
	// series, client "exited" (pid ""), summing the clients that have
	// exited, from the agent's start.
	labels = []string{"client", "pid"}

	descResident = prometheus.NewDesc("rmem_agent_resident_bytes", "Resident bytes of a client's paged regions.", labels, nil)
	descRemote   = prometheus.NewDesc("rmem_agent_remote_bytes", "Bytes of a client's pages held in the pool.", labels, nil)
	descBudget   = prometheus.NewDesc("rmem_agent_budget_bytes", "A client's budget of resident bytes.", labels, nil)
	descFaults   = prometheus.NewDesc("rmem_agent_faults_total", "Missing-page faults served.", labels, nil)
	descZero     = prometheus.NewDesc("rmem_agent_zero_fills_total", "Faults served with a zero page.", labels, nil)
	descReads    = prometheus.NewDesc("rmem_agent_remote_reads_total", "Pages read from the pool (faults and prefetches).", labels, nil)
	descWP       = prometheus.NewDesc("rmem_agent_wp_faults_total", "Write-protect faults (first write to a clean page).", labels, nil)
	descEvict    = prometheus.NewDesc("rmem_agent_evictions_total", "Pages evicted.", labels, nil)
	descWB       = prometheus.NewDesc("rmem_agent_write_backs_total", "Dirty pages written back to the pool.", labels, nil)
	descLost     = prometheus.NewDesc("rmem_agent_lost_pages_total", "Pages poisoned because every replica was gone.", labels, nil)
	descChecksum = prometheus.NewDesc("rmem_agent_checksum_errors_total", "Copies of a client's pages read from the pool that failed their checksum (repaired from another replica, or the page is lost).", labels, nil)
	descPooled   = prometheus.NewDesc("rmem_agent_pooled_bytes", "Pool slots a client names: its remote pages and the clean resident ones whose pool copy is kept.", labels, nil)
	descWaits    = prometheus.NewDesc("rmem_agent_budget_waits_total", "Faults that waited because the client was past its budget and no eviction could run (no pool room).", labels, nil)
	descPFIssued = prometheus.NewDesc("rmem_agent_prefetch_issued_total", "Pages prefetched.", labels, nil)
	descPFHits   = prometheus.NewDesc("rmem_agent_prefetch_hits_total", "Sampled prefetched pages (1 in 256, held back until touched) that the program touched.", labels, nil)
	descPFWasted = prometheus.NewDesc("rmem_agent_prefetch_wasted_total", "Sampled prefetched pages (1 in 256) not touched before their sample slot was needed again.", labels, nil)
	descRAHits   = prometheus.NewDesc("rmem_agent_readahead_hits_total", "Faults on a stream's read-ahead marker: served without a READ, they fetch the stream's next window.", labels, nil)
	descLatency  = prometheus.NewDesc("rmem_agent_fault_seconds", "Time from reading a fault to resolving it.", labels, nil)
	descLatQ     = prometheus.NewDesc("rmem_agent_fault_quantile_seconds", "Quantiles of rmem_agent_fault_seconds (p50, p99, p99.9) from the agent's ~1%-precise histogram.", labels, nil)
	descInstall  = prometheus.NewDesc("rmem_agent_install_p50_seconds", "Median time of the UFFDIO_COPY that maps a page read from the pool and wakes the thread waiting for it (the last step of such a fault).", labels, nil)
	descRing     = prometheus.NewDesc("rmem_agent_ring_faults_total", "Faults served in the faulting thread, through the fault ring (of the missing-page and write-protect faults).", labels, nil)
	descRingWait = prometheus.NewDesc("rmem_agent_ring_wait_seconds", "How long the threads of faults served through the fault ring waited, from their post to the agent's answer.", labels, nil)
	descStall    = prometheus.NewDesc("rmem_agent_stall_ratio", "Share of wall time a client's threads spent in misses over the slowdown controller's last step (clients whose budget a slowdown target steers).", labels, nil)
	descStallSec = prometheus.NewDesc("rmem_agent_stall_seconds_total", "Time a client's threads spent in misses (first touches not counted), as the agent measures it plus its estimate of the trap and wake-up it does not see.", labels, nil)
	descAuto     = prometheus.NewDesc("rmem_agent_budget_auto", "1 when a client's budget is steered by a slowdown target (--max-slowdown), 0 when fixed.", labels, nil)
	descClients  = prometheus.NewDesc("rmem_agent_clients", "Client processes served.", nil, nil)
	descHeld     = prometheus.NewDesc("rmem_agent_pool_held_bytes", "Pool memory the agent holds (its slabs).", nil, nil)
	descUsed     = prometheus.NewDesc("rmem_agent_pool_used_bytes", "Pool memory holding pages' data (used slots).", nil, nil)
	descStored   = prometheus.NewDesc("rmem_agent_pool_stored_bytes", "Memory the servers hold for the agent's pages: each used slot once per copy of its slab, and erasure-coded slabs' parity.", nil, nil)
	descNoRoom   = prometheus.NewDesc("rmem_agent_pool_no_room", "1 while the pool gives the agent no more memory.", nil, nil)
	descShmSegs  = prometheus.NewDesc("rmem_agent_shared_segments", "Shared memory segments the agent pages (state paged), and those it keeps unpaged and guarded because the pool lost some of their pages (state lost).", []string{"state"}, nil)
	descShmRel   = prometheus.NewDesc("rmem_agent_shared_releases_total", "Shared memory segments released (brought back into their files, paged no more) because something reached them outside the agent's proxies: an open or read by a process outside the agent, a mapping the shim cannot register or the agent cannot make a proxy.", nil, nil)
)

// metricCounters are the per-client counters, each with its figure in
// ClientStats: the live clients' series and the exited one read the same
// list. (The ring's faults are exported for a ring client only, and for
// the exited sum.)
var metricCounters = []struct {
	d *prometheus.Desc
	v func(*ClientStats) float64
}{
	{descFaults, func(s *ClientStats) float64 { return float64(s.Faults) }},
	{descZero, func(s *ClientStats) float64 { return float64(s.ZeroFills) }},
	{descReads, func(s *ClientStats) float64 { return float64(s.RemoteReads) }},
	{descWP, func(s *ClientStats) float64 { return float64(s.WPFaults) }},
	{descEvict, func(s *ClientStats) float64 { return float64(s.Evictions) }},
	{descWB, func(s *ClientStats) float64 { return float64(s.WriteBacks) }},
	{descLost, func(s *ClientStats) float64 { return float64(s.Lost) }},
	{descChecksum, func(s *ClientStats) float64 { return float64(s.ChecksumErrors) }},
	{descWaits, func(s *ClientStats) float64 { return float64(s.BudgetWaits) }},
	{descPFIssued, func(s *ClientStats) float64 { return float64(s.PrefetchIssued) }},
	{descPFHits, func(s *ClientStats) float64 { return float64(s.PrefetchHits) }},
	{descPFWasted, func(s *ClientStats) float64 { return float64(s.PrefetchWasted) }},
	{descRAHits, func(s *ClientStats) float64 { return float64(s.ReadaheadHits) }},
	{descStallSec, func(s *ClientStats) float64 { return s.Stall.Seconds() }},
	{descRing, func(s *ClientStats) float64 { return float64(s.RingFaults) }},
}

// collector exports every client's figures (the same as Agent.Stats).
type collector struct{ a *Agent }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descResident, descRemote, descBudget, descPooled, descLatency, descLatQ, descInstall, descRingWait,
		descClients, descHeld, descUsed, descStored, descNoRoom, descStall, descAuto, descShmSegs, descShmRel} {
		ch <- d
	}
	for _, m := range metricCounters {
		ch <- m.d
	}
}

func (col collector) Collect(ch chan<- prometheus.Metric) {
	a := col.a
	a.mu.Lock()
	cs := make([]*client, 0, len(a.clients))
	for _, c := range a.clients {
		cs = append(cs, c)
	}
	gone := a.gone
	a.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(len(cs)))
	ps := a.Pool()
	ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(ps.HeldBytes))
	ch <- prometheus.MustNewConstMetric(descUsed, prometheus.GaugeValue, float64(ps.UsedBytes))
	ch <- prometheus.MustNewConstMetric(descStored, prometheus.GaugeValue, float64(ps.StoredBytes))
	noRoom := 0.0
	if ps.NoRoom != "" {
		noRoom = 1
	}
	ch <- prometheus.MustNewConstMetric(descNoRoom, prometheus.GaugeValue, noRoom)
	paged, lost, releases := a.shm.census()
	ch <- prometheus.MustNewConstMetric(descShmSegs, prometheus.GaugeValue, float64(paged), "paged")
	ch <- prometheus.MustNewConstMetric(descShmSegs, prometheus.GaugeValue, float64(lost), "lost")
	ch <- prometheus.MustNewConstMetric(descShmRel, prometheus.CounterValue, float64(releases))
	// The counters of the clients that have exited, as one series
	// (client "exited"), there from the start: a sum over clients does
	// not fall when one exits, and an alert on lost pages or waits has a
	// series at zero before the first.
	for _, m := range metricCounters {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, m.v(&gone), "exited", "")
	}
	for _, c := range cs {
		s := c.st.snapshot(pageSize)
		lv := []string{strconv.FormatUint(c.id, 10), strconv.FormatInt(c.pidAtm.Load(), 10)}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		gauge(descResident, float64(s.ResidentBytes))
		gauge(descRemote, float64(s.RemoteBytes))
		gauge(descBudget, float64(c.budgetPages()*pageSize))
		gauge(descPooled, float64(s.PooledBytes))
		auto := 0.0
		if a.target(c) > 0 {
			auto = 1
			gauge(descStall, math.Float64frombits(c.bud.stallFrac.Load()))
		}
		gauge(descAuto, auto)
		for _, m := range metricCounters {
			if m.d != descRing || c.ring != nil {
				ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, m.v(&s), lv...)
			}
		}
		buckets, count, sum := c.st.latency.Buckets()
		ch <- prometheus.MustNewConstHistogram(descLatency, count, sum, buckets, lv...)
		ch <- prometheus.MustNewConstSummary(descLatQ, count, sum, map[float64]float64{
			0.5: s.FaultP50.Seconds(), 0.99: s.FaultP99.Seconds(), 0.999: s.FaultP999.Seconds()}, lv...)
		ch <- prometheus.MustNewConstMetric(descInstall, prometheus.GaugeValue, s.InstallP50.Seconds(), lv...)
		if c.ring != nil {
			buckets, count, sum := c.st.ring.Buckets()
			ch <- prometheus.MustNewConstHistogram(descRingWait, count, sum, buckets, lv...)
		}
	}
}
