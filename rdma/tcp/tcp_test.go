package tcp

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"rmem/rdma"
	"rmem/rdma/rdmatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newEnv(t *testing.T, lo rdma.ListenOptions, do rdma.DialOptions) *rdmatest.Env {
	d := rdma.NewDomain(rdma.DomainOptions{})
	r, err := rdma.AllocRegion(rdmatest.ConformanceRegionSize, rdma.RegionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Deregister(context.Background(), r); err != nil {
			t.Error(err)
		}
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	l, err := Listen("127.0.0.1:0", d, lo)
	if err != nil {
		t.Fatal(err)
	}
	e := &rdmatest.Env{Network: Network, Addr: l.Addr(), Domain: d, Region: r, Options: do}
	e.Kill = func() { l.Close() }
	e.Restart = func() {
		if l, err = Listen(e.Addr, d, lo); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		l.Close()
	})
	return e
}

func TestConformance(t *testing.T) {
	rdmatest.RunConformance(t, func(t *testing.T) *rdmatest.Env {
		return newEnv(t, rdma.ListenOptions{}, rdma.DialOptions{})
	})
}
