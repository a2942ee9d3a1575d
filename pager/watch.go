package pager

import (
	"sync"
	"sync/atomic"
	"time"
)

// turnWatch lets a caller wait for a condition over what the loops and the
// reservoir change (stats, the pool, the clients), without polling: it is
// told after every turn of a loop, round of the reservoir and client
// started or dropped, and wakes its waiters then. The tests wait on it
// (export_test.go: WaitForTest), where they would otherwise sleep. While
// no one waits, a note is one atomic load.
type turnWatch struct {
	waiters atomic.Int32
	mu      sync.Mutex
	ch      chan struct{} // closed at the next note; nil: no waiter took one
}

// note tells the waiters that something may have changed.
func (w *turnWatch) note() {
	if w.waiters.Load() == 0 {
		return
	}
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}

// wait waits until cond holds, checked now and after each note, for at
// most d; it reports whether cond held.
func (w *turnWatch) wait(d time.Duration, cond func() bool) bool {
	w.waiters.Add(1)
	defer w.waiters.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		w.mu.Lock()
		if w.ch == nil {
			w.ch = make(chan struct{})
		}
		ch := w.ch
		w.mu.Unlock()
		if cond() { // after taking ch: a change from now on closes it
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return cond()
		}
	}
}
