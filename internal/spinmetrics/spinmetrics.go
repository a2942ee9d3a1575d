// Package spinmetrics exports the spin sites of a daemon (spin.Site: how
// long its threads polled for their next event, and what that caught) as
// Prometheus metrics. The daemons (agentd, memdd) own their sites and
// register this collector; the parts whose threads spin (the transport,
// the pager) know nothing of Prometheus.
package spinmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"rmem/spin"
)

var (
	descSpun   = prometheus.NewDesc("rmem_spin_seconds_total", "CPU time threads spent polling for their next event before blocking, by kind of thread.", []string{"site"}, nil)
	descHits   = prometheus.NewDesc("rmem_spin_hits_total", "Waits a poll ended: wake-ups saved.", []string{"site"}, nil)
	descMisses = prometheus.NewDesc("rmem_spin_misses_total", "Spins that ran out and blocked after all.", []string{"site"}, nil)
)

// Collector exports sites.
func Collector(sites ...*spin.Site) prometheus.Collector { return collector(sites) }

type collector []*spin.Site

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSpun
	ch <- descHits
	ch <- descMisses
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, site := range c {
		s := site.Stats()
		ch <- prometheus.MustNewConstMetric(descSpun, prometheus.CounterValue, s.Spun.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(s.Hits), s.Name)
		ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(s.Misses), s.Name)
	}
}
