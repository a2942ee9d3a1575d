package spinmetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rmem/internal/spinmetrics"
	"rmem/spin"
)

func TestCollector(t *testing.T) {
	site := &spin.Site{Name: "collector-test"}
	w := spin.New(time.Hour, site)
	for range 3 {
		start, until := w.Start()
		w.Done(start, until, true)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(spinmetrics.Collector(site, &spin.Site{Name: "idle"}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			found[mf.GetName()+"{"+m.GetLabel()[0].GetValue()+"}"] = m.GetCounter().GetValue()
		}
	}
	if found["rmem_spin_hits_total{collector-test}"] != 3 {
		t.Fatalf("rmem_spin_hits_total{site=collector-test} 3 not exported: %v", found)
	}
	if v, ok := found["rmem_spin_misses_total{idle}"]; !ok || v != 0 {
		t.Fatalf("an idle site is not exported as 0: %v", found)
	}
}
