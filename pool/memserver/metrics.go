package memserver

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics adds the server's gauges and counters to reg.
func (s *Server) RegisterMetrics(reg prometheus.Registerer) error {
	slabs := float64(len(s.keys))
	cols := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rmem_memserver_capacity_bytes", Help: "Bytes donated by this memory server."},
			func() float64 { return float64(s.opts.Capacity) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rmem_memserver_slabs_granted", Help: "Slabs with a live key."},
			func() float64 { return float64(s.live.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rmem_memserver_slabs", Help: "Slabs this server donates."},
			func() float64 { return slabs }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rmem_memserver_ops_total", Help: "Data-plane operations served."},
			func() float64 {
				st := s.domain.Stats()
				return float64(st.Reads + st.Writes + st.CompareSwaps + st.FetchAdds)
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rmem_memserver_bytes_read_total", Help: "Bytes served by READs."},
			func() float64 { return float64(s.domain.Stats().BytesRead) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rmem_memserver_bytes_written_total", Help: "Bytes received by WRITEs."},
			func() float64 { return float64(s.domain.Stats().BytesWritten) }),
	}
	for _, c := range cols {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
