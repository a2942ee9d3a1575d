package shm

import (
	"context"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"rmem/rdma"
	"rmem/rdma/rdmatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newEnv(t *testing.T) *rdmatest.Env {
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
	path := filepath.Join(t.TempDir(), "memd-shm.sock")
	l, err := Listen(path, d, rdma.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := &rdmatest.Env{Network: Network, Addr: path, Domain: d, Region: r}
	e.Kill = func() { l.Close() }
	e.Restart = func() {
		if l, err = Listen(path, d, rdma.ListenOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { l.Close() })
	return e
}

func TestConformance(t *testing.T) {
	rdmatest.RunConformance(t, newEnv)
}
