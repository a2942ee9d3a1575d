package rdmatest

import (
	"testing"

	"go.uber.org/goleak"

	"rmem/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	RunConformance(t, func(t *testing.T) *Env {
		d := rdma.NewDomain(rdma.DomainOptions{})
		r := rdma.NewRegion(make([]byte, ConformanceRegionSize))
		if err := d.Register(r); err != nil {
			t.Fatal(err)
		}
		l, err := Listen("", d, rdma.ListenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e := &Env{Network: Network, Addr: l.Addr(), Domain: d, Region: r}
		e.Kill = func() { l.Close() }
		e.Restart = func() {
			if l, err = Listen(e.Addr, d, rdma.ListenOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { l.Close() })
		return e
	})
}
