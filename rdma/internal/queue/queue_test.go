package queue

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"rmem/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNoLostWakeups: a completer and a waiter race for a long time; every
// completion must be returned, in order, without the waiter hanging.
func TestNoLostWakeups(t *testing.T) {
	const depth, total = 8, 20000
	q := New(depth)
	wr := []rdma.WorkRequest{{Op: rdma.OpRead}}
	var wg sync.WaitGroup
	posted := make(chan struct{}, depth)
	wg.Go(func() { // completer
		for range total {
			<-posted
			if _, ok := q.Next(); !ok {
				t.Error("nothing to complete")
				return
			}
			q.Complete(rdma.StatusOK, 0, 0)
		}
	})
	cq := make([]rdma.Completion, depth)
	next := uint64(0)
	for seq := uint64(0); next < total; {
		for seq < total && seq-next < depth {
			wr[0].ID = seq
			if _, err := q.Enqueue(wr); err != nil {
				t.Fatal(err)
			}
			posted <- struct{}{}
			seq++
		}
		n, err := q.Wait(context.Background(), cq)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cq[:n] {
			if c.ID != next {
				t.Fatalf("completion %d, want %d", c.ID, next)
			}
			next++
		}
	}
	wg.Wait()
	if _, err := q.Wait(context.Background(), cq); !errors.Is(err, rdma.ErrIdle) {
		t.Fatalf("idle wait: %v", err)
	}
}

func TestFailCompletesEverything(t *testing.T) {
	q := New(4)
	local := make([]byte, 8)
	wrs := []rdma.WorkRequest{{ID: 1, Op: rdma.OpFetchAdd, Local: local}, {ID: 2, Op: rdma.OpRead}, {ID: 3, Op: rdma.OpWrite}}
	if _, err := q.Enqueue(wrs); err != nil {
		t.Fatal(err)
	}
	q.Complete(rdma.StatusOK, 8, 0x1122)
	if local[0] != 0x22 || local[1] != 0x11 {
		t.Fatalf("atomic old value not stored in Local: %x", local)
	}
	cause := errors.New("wire cut")
	q.Fail(cause)
	cq := make([]rdma.Completion, 4)
	n, err := q.Poll(cq)
	if err != nil || n != 3 || cq[0].Status != rdma.StatusOK || cq[1].Status != rdma.StatusTransport || cq[2].Status != rdma.StatusTransport || cq[2].ID != 3 {
		t.Fatalf("after Fail: %d %v %+v", n, err, cq[:n])
	}
	if _, err := q.Enqueue(wrs[:1]); !errors.Is(err, rdma.ErrTransport) || !errors.Is(err, cause) {
		t.Fatalf("enqueue after Fail: %v", err)
	}
	if _, err := q.Wait(context.Background(), cq); !errors.Is(err, rdma.ErrTransport) {
		t.Fatalf("wait after Fail: %v", err)
	}
	q.Close()
	q.Close()
	if _, err := q.Poll(cq); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("poll after Close: %v", err)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	q := New(2)
	if _, err := q.Enqueue([]rdma.WorkRequest{{Op: rdma.OpRead}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.Wait(ctx, make([]rdma.Completion, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled ctx: %v", err)
	}
}
