package coord

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"rmem/pool"
)

type metrics struct {
	slabsAllocated prometheus.Counter
	slabsFreed     prometheus.Counter
	allocFailures  prometheus.Counter
	leaseExpiries  prometheus.Counter
	serversDead    prometheus.Counter
	replacements   prometheus.Counter
}

func notFound(kind, id string) error { return fmt.Errorf("%w: %s %q", pool.ErrNotFound, kind, id) }

func newMetrics(c *Coordinator, reg *prometheus.Registry) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "rmem", Subsystem: "pool", Name: name, Help: help})
	}
	m := &metrics{
		slabsAllocated: counter("slabs_allocated_total", "Logical slabs allocated to agents."),
		slabsFreed:     counter("slabs_freed_total", "Logical slabs freed (by agents, lease end or expiry)."),
		allocFailures:  counter("allocation_failures_total", "Allocation requests that failed (nothing was allocated)."),
		leaseExpiries:  counter("lease_expiries_total", "Leases that expired without renewal."),
		serversDead:    counter("servers_dead_total", "Times a server was marked dead for missing heartbeats."),
		replacements:   counter("replica_replacements_total", "Replacement replicas placed (drain, lost servers)."),
	}
	for _, col := range []prometheus.Collector{m.slabsAllocated, m.slabsFreed, m.allocFailures, m.leaseExpiries, m.serversDead, m.replacements, &stateCollector{c: c}} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("coord: metrics: %w", err)
		}
	}
	return m, nil
}

// stateCollector reports gauges computed from the state at scrape time.
type stateCollector struct{ c *Coordinator }

var (
	descCapacity = prometheus.NewDesc("rmem_pool_capacity_bytes", "Bytes donated by servers that are up.", nil, nil)
	descUsed     = prometheus.NewDesc("rmem_pool_used_bytes", "Bytes of slabs in use on servers that are up.", nil, nil)
	descSlabs    = prometheus.NewDesc("rmem_pool_slabs", "Physical slabs on servers that are up, by state (free, used, draining: free slabs of draining servers).", []string{"state"}, nil)
	descServers  = prometheus.NewDesc("rmem_pool_servers", "Servers by state.", []string{"state"}, nil)
	descLeases   = prometheus.NewDesc("rmem_pool_leases", "Live leases (agents).", nil, nil)
	descHBAge    = prometheus.NewDesc("rmem_pool_server_heartbeat_age_seconds", "Seconds since each server's last heartbeat.", []string{"server"}, nil)
	descHealth   = prometheus.NewDesc("rmem_pool_logical_slabs", "Logical slabs by replication health (healthy, degraded, lost, unknown: on servers not heard from since the coordinator started).", []string{"health"}, nil)
)

func (sc *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descUsed, descSlabs, descServers, descLeases, descHBAge, descHealth} {
		ch <- d
	}
}

func (sc *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st := sc.c.Status()
	c := sc.c
	c.mu.Lock()
	now := c.clock.Now()
	var free, used, draining float64
	states := map[pool.ServerState]float64{pool.ServerUp: 0, pool.ServerDead: 0, pool.ServerLeft: 0, pool.ServerUnknown: 0}
	for _, s := range c.servers {
		if s.rec.State == pool.ServerUp && !s.heard {
			states[pool.ServerUnknown]++
		} else {
			states[s.rec.State]++
		}
		ch <- prometheus.MustNewConstMetric(descHBAge, prometheus.GaugeValue, now.Sub(s.lastHB).Seconds(), string(s.rec.ID))
		if s.rec.State != pool.ServerUp {
			continue
		}
		used += float64(s.nused)
		if s.rec.Draining {
			draining += float64(s.free())
		} else {
			free += float64(s.free())
		}
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(st.Capacity))
	ch <- prometheus.MustNewConstMetric(descUsed, prometheus.GaugeValue, float64(st.Used))
	ch <- prometheus.MustNewConstMetric(descSlabs, prometheus.GaugeValue, free, "free")
	ch <- prometheus.MustNewConstMetric(descSlabs, prometheus.GaugeValue, used, "used")
	ch <- prometheus.MustNewConstMetric(descSlabs, prometheus.GaugeValue, draining, "draining")
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(descServers, prometheus.GaugeValue, n, string(state))
	}
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(st.Agents))
	ch <- prometheus.MustNewConstMetric(descHealth, prometheus.GaugeValue, float64(st.SlabsHealthy), "healthy")
	ch <- prometheus.MustNewConstMetric(descHealth, prometheus.GaugeValue, float64(st.SlabsDegraded), "degraded")
	ch <- prometheus.MustNewConstMetric(descHealth, prometheus.GaugeValue, float64(st.SlabsLost), "lost")
	ch <- prometheus.MustNewConstMetric(descHealth, prometheus.GaugeValue, float64(st.SlabsUnknown), "unknown")
}
