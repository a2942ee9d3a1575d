package tcp

import (
	"context"
	"errors"
	"testing"
	"time"

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

func TestMaxConns(t *testing.T) {
	e := newEnv(t, rdma.ListenOptions{MaxConns: 1}, rdma.DialOptions{})
	ctx := context.Background()
	k, _ := e.Domain.IssueKey(e.Region, 0, 4096, rdma.AccessReadWrite)
	c1, err := Dial(ctx, e.Addr, rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(ctx, e.Addr, rdma.DialOptions{}); !errors.Is(err, rdma.ErrTransport) {
		t.Fatalf("second connection: %v", err)
	}
	if err := rdma.Write(ctx, c1, k, 0, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	c1.Close()
	deadline := time.Now().Add(20 * time.Second) // hang guard while the server reaps c1
	for {
		c2, err := Dial(ctx, e.Addr, rdma.DialOptions{})
		if err == nil {
			c2.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection after the first closed: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}
