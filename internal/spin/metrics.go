package spin

import "github.com/prometheus/client_golang/prometheus"

var (
	descSpun   = prometheus.NewDesc("rmem_spin_seconds_total", "CPU time threads spent polling for their next event before blocking, by kind of thread.", []string{"site"}, nil)
	descHits   = prometheus.NewDesc("rmem_spin_hits_total", "Waits a poll ended: wake-ups saved.", []string{"site"}, nil)
	descMisses = prometheus.NewDesc("rmem_spin_misses_total", "Spins that ran out and blocked after all.", []string{"site"}, nil)
)

// Collector exports this process's Sites.
func Collector() prometheus.Collector { return collector{} }

type collector struct{}

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSpun
	ch <- descHits
	ch <- descMisses
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range Sites() {
		ch <- prometheus.MustNewConstMetric(descSpun, prometheus.CounterValue, s.Spun.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(s.Hits), s.Name)
		ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(s.Misses), s.Name)
	}
}
