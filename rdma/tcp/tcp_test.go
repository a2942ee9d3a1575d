package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
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

// TestConformanceThreadWait: the same suite with Wait blocking the thread
// in poll(2) (the pager's fault loops dial this way): deadlines,
// cancellation and Close of a waiting connection must still end the wait.
func TestConformanceThreadWait(t *testing.T) {
	rdmatest.RunConformance(t, func(t *testing.T) *rdmatest.Env {
		return newEnv(t, rdma.ListenOptions{}, rdma.DialOptions{ThreadWait: true})
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

// TestWaitWithDeadlineDoesNotAllocate: the pager waits with a timeout.
func TestWaitWithDeadlineDoesNotAllocate(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	e := newEnv(t, rdma.ListenOptions{}, rdma.DialOptions{})
	k, _ := e.Domain.IssueKey(e.Region, 0, 1<<20, rdma.AccessReadWrite)
	c, err := Dial(context.Background(), e.Addr, rdma.DialOptions{Depth: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	wrs := []rdma.WorkRequest{{Op: rdma.OpRead, Key: k, Local: make([]byte, 4096)}}
	cq := make([]rdma.Completion, 1)
	var failed error
	op := func() {
		if err := c.Post(wrs); err != nil {
			failed = err
			return
		}
		if _, err := c.Wait(ctx, cq); err != nil {
			failed = err
		}
	}
	op()
	if n := testing.AllocsPerRun(500, op); n != 0 || failed != nil {
		t.Fatalf("%v allocations per op with a deadline ctx (%v)", n, failed)
	}
}

// TestWaitReturnsOnContext: a server that accepts and then never answers
// must not hang Wait, with a deadline, with a cancel-only ctx, or when
// another goroutine closes the connection; in both wait modes.
func TestWaitReturnsOnContext(t *testing.T) {
	for _, tw := range []bool{false, true} {
		t.Run(map[bool]string{false: "netpoller", true: "ThreadWait"}[tw], func(t *testing.T) {
			testWaitReturnsOnContext(t, tw)
		})
	}
}

func testWaitReturnsOnContext(t *testing.T, threadWait bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		var b [helloSize]byte
		io.ReadFull(s, b[:])
		putHello(b[:], hello{Version: version, MaxTransfer: rdma.MaxTransfer})
		s.Write(b[:])
		io.Copy(io.Discard, s) // read requests, answer nothing
	})
	c, err := Dial(context.Background(), ln.Addr().String(), rdma.DialOptions{ThreadWait: threadWait})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Post([]rdma.WorkRequest{{Op: rdma.OpRead, Local: make([]byte, 8)}}); err != nil {
		t.Fatal(err)
	}
	cq := make([]rdma.Completion, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(ctx, cq); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with a deadline: %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel2)
	if _, err := c.Wait(ctx2, cq); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled ctx: %v", err)
	}
	// The request is still outstanding: a Close from another goroutine
	// ends a Wait blocked without a deadline.
	done := make(chan error, 1)
	go func() {
		_, err := c.Wait(context.Background(), cq)
		done <- err
	}()
	time.Sleep(30 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("wait after close: no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a blocked Wait")
	}
}

// TestThreadWaitSocketClosed: a ThreadWait connection's socket leaves the
// netpoller (its own descriptor): Close must close it; no descriptor is
// left behind.
func TestThreadWaitSocketClosed(t *testing.T) {
	d := rdma.NewDomain(rdma.DomainOptions{})
	r, err := rdma.AllocRegion(4096, rdma.RegionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	defer d.Deregister(context.Background(), r)
	key, err := d.IssueKey(r, 0, 4096, rdma.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen("127.0.0.1:0", d, rdma.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The server closes its side when it sees the client go: count once
	// it has.
	settled := func() int {
		t.Helper()
		for start := time.Now(); l.Conns() > 0; time.Sleep(time.Millisecond) {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("the server still serves %d connections", l.Conns())
			}
		}
		return openFDs(t)
	}
	before := settled()
	for range 20 {
		c, err := Dial(context.Background(), l.Addr(), rdma.DialOptions{ThreadWait: true})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		if err := c.Post([]rdma.WorkRequest{{Op: rdma.OpRead, Local: buf, Key: key}}); err != nil {
			t.Fatal(err)
		}
		cq := make([]rdma.Completion, 1)
		if _, err := c.Wait(context.Background(), cq); err != nil || cq[0].Status != rdma.StatusOK {
			t.Fatalf("read: %v %v", err, cq[0].Status)
		}
		c.Close()
		c.Close()
	}
	if after := settled(); after > before {
		t.Fatalf("%d descriptors open before, %d after 20 connections closed", before, after)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(ents)
}
