package queue

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"rmem/rdma"
)

// Slot is one posted request.
type Slot struct {
	ID    uint64
	Op    rdma.Opcode
	Local []byte
	C     rdma.Completion
}

// Queue is a ring of at most depth outstanding requests.
type Queue struct {
	notify  chan struct{} // cap 1: a completion or failure happened
	closed  chan struct{} // closed by Close
	waiters atomic.Int32  // goroutines in WaitEvent: wake only if > 0

	mu       sync.Mutex
	slots    []Slot
	head     uint64 // next to return to the caller; guarded by mu
	done     uint64 // next to complete; guarded by mu
	tail     uint64 // next to post; guarded by mu
	err      error  // transport failure cause; guarded by mu
	isClosed bool
}

// New returns a queue of the given depth (>= 1).
func New(depth int) *Queue {
	return &Queue{
		notify: make(chan struct{}, 1),
		closed: make(chan struct{}),
		slots:  make([]Slot, depth),
	}
}

func (q *Queue) slot(seq uint64) *Slot { return &q.slots[seq%uint64(len(q.slots))] }

// Err returns the transport failure, or nil.
func (q *Queue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Enqueue checks every request and appends all of them, or none. It returns
// the sequence number of the first.
func (q *Queue) Enqueue(wrs []rdma.WorkRequest) (uint64, error) {
	for i := range wrs {
		if err := wrs[i].Check(); err != nil {
			return 0, err
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.isClosed {
		return 0, rdma.ErrClosed
	}
	if q.err != nil {
		return 0, fmt.Errorf("%w: %w", rdma.ErrTransport, q.err)
	}
	if q.tail-q.head+uint64(len(wrs)) > uint64(len(q.slots)) {
		return 0, rdma.ErrQueueFull
	}
	first := q.tail
	for i := range wrs {
		s := q.slot(q.tail)
		*s = Slot{ID: wrs[i].ID, Op: wrs[i].Op, Local: wrs[i].Local}
		q.tail++
	}
	return first, nil
}

// Next returns the oldest posted, not yet completed request, or false if
// there is none. The slot is stable until Complete.
func (q *Queue) Next() (*Slot, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done == q.tail {
		return nil, false
	}
	return q.slot(q.done), true
}

// Tail returns the sequence number the next posted request will get. For
// the completer, every request below it is posted and stays stable until
// it completes it, so it may read them with At without the lock.
func (q *Queue) Tail() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.tail
}

// At returns the request with sequence number seq. Preconditions: called
// by the completer, seq is not completed and below a value Tail returned.
func (q *Queue) At(seq uint64) *Slot { return q.slot(seq) }

// Complete completes the request Next returned. For a successful atomic
// whose Local has at least 8 bytes it also stores value there.
func (q *Queue) Complete(st rdma.Status, n uint32, value uint64) {
	q.mu.Lock()
	if q.done == q.tail {
		q.mu.Unlock()
		return
	}
	s := q.slot(q.done)
	s.C = rdma.Completion{ID: s.ID, Op: s.Op, Status: st, Len: n, Value: value}
	if st == rdma.StatusOK && s.Op.IsAtomic() && len(s.Local) >= rdma.AtomicSize {
		binary.NativeEndian.PutUint64(s.Local, value)
	}
	s.Local = nil
	q.done++
	q.mu.Unlock()
	q.wake()
}

// Fail records a transport failure and completes every outstanding request
// with StatusTransport. Later Enqueues fail. The first cause is kept.
func (q *Queue) Fail(cause error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = cause
	}
	for q.done != q.tail {
		s := q.slot(q.done)
		s.C = rdma.Completion{ID: s.ID, Op: s.Op, Status: rdma.StatusTransport}
		s.Local = nil
		q.done++
	}
	q.mu.Unlock()
	q.wake()
}

// Pending reports whether a posted request awaits its completion.
func (q *Queue) Pending() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done != q.tail
}

// WaitEvent blocks until a completion, failure or Wake, unless one is
// already there, the queue is closed, or ctx is done.
func (q *Queue) WaitEvent(ctx context.Context) error {
	q.waiters.Add(1)
	defer q.waiters.Add(-1)
	// Re-check after announcing ourselves: a completer that ran before
	// the Add did not wake us.
	q.mu.Lock()
	ready := q.head != q.done || q.isClosed || q.err != nil
	q.mu.Unlock()
	if ready {
		return nil
	}
	select {
	case <-q.notify:
		return nil
	case <-q.closed:
		return rdma.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wake wakes a goroutine in WaitEvent, if any.
func (q *Queue) Wake() { q.wake() }

// Check copies ready completions like Poll and also reports whether a
// posted request still awaits its completion and, when nothing at all is
// outstanding, ErrIdle or the transport failure.
func (q *Queue) Check(cqes []rdma.Completion) (n int, pending bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.isClosed {
		return 0, false, rdma.ErrClosed
	}
	for n < len(cqes) && q.head != q.done {
		cqes[n] = q.slot(q.head).C
		q.head++
		n++
	}
	if n == 0 && q.head == q.tail {
		if q.err != nil {
			return 0, false, fmt.Errorf("%w: %w", rdma.ErrTransport, q.err)
		}
		return 0, false, rdma.ErrIdle
	}
	return n, q.done != q.tail, nil
}

func (q *Queue) wake() {
	if q.waiters.Load() == 0 {
		return
	}
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Poll copies up to len(cqes) completions, oldest first.
func (q *Queue) Poll(cqes []rdma.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.isClosed {
		return 0, rdma.ErrClosed
	}
	n := 0
	for n < len(cqes) && q.head != q.done {
		cqes[n] = q.slot(q.head).C
		q.head++
		n++
	}
	return n, nil
}

// Outstanding returns the number of posted requests not yet returned by
// Poll or Wait.
func (q *Queue) Outstanding() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int(q.tail - q.head)
}

// Wait blocks until at least one completion is ready and returns it (and
// any others that fit), or returns ErrIdle when nothing is outstanding, or
// ctx's error. It is for providers whose completions are produced by
// others (or synchronously in Post).
func (q *Queue) Wait(ctx context.Context, cqes []rdma.Completion) (int, error) {
	if len(cqes) == 0 {
		return 0, nil
	}
	for {
		n, _, err := q.Check(cqes)
		if n > 0 || err != nil {
			return n, err
		}
		if err := q.WaitEvent(ctx); err != nil {
			return 0, err
		}
	}
}

// Close makes Poll and Wait return ErrClosed and Enqueue fail. Completions
// not yet returned are dropped. It is safe to call twice.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.isClosed {
		q.isClosed = true
		close(q.closed)
	}
}
