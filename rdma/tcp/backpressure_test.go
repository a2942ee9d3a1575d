package tcp

import (
	"context"
	"testing"
	"time"

	"rmem/rdma"
)

// TestPostDoesNotDeadlock: one goroutine posts big READs and then big
// WRITEs without waiting in between. The server blocks writing READ
// replies that nobody reads while the client blocks writing WRITE
// payloads, unless Post drains replies while its write cannot progress.
func TestPostDoesNotDeadlock(t *testing.T) {
	e := newEnv(t, rdma.ListenOptions{}, rdma.DialOptions{})
	k, _ := e.Domain.IssueKey(e.Region, 0, e.Region.Len(), rdma.AccessReadWrite)
	const n, size = 64, rdma.MaxTransfer
	c, err := Dial(context.Background(), e.Addr, rdma.DialOptions{Depth: 2 * n})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reads := make([]rdma.WorkRequest, n)
	writes := make([]rdma.WorkRequest, n)
	for i := range n {
		reads[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: k, Offset: uint64(i%4) * size, Local: make([]byte, size)}
		writes[i] = rdma.WorkRequest{ID: uint64(n + i), Op: rdma.OpWrite, Key: k, Offset: uint64(i%4) * size, Local: make([]byte, size)}
	}
	done := make(chan error, 1)
	go func() {
		if err := c.Post(reads); err != nil {
			done <- err
			return
		}
		done <- c.Post(writes)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // hang guard
		c.Close()
		<-done
		t.Fatal("Post deadlocked against the server's replies")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cq := make([]rdma.Completion, 2*n)
	for got := 0; got < 2*n; {
		m, err := c.Wait(ctx, cq[got:])
		if err != nil {
			t.Fatal(err)
		}
		for _, ce := range cq[got : got+m] {
			if ce.Status != rdma.StatusOK {
				t.Fatalf("%+v", ce)
			}
		}
		got += m
	}
}
