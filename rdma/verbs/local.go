//go:build verbs

package verbs

import (
	"errors"
	"fmt"
	"runtime"

	"rmem/rdma"
)

// LocalRegistrar is implemented by the verbs provider's connections (check
// with a type assertion on the rdma.Conn). A request whose Local buffer
// lies inside memory registered with RegisterLocal moves directly between
// that memory and the device (ibv_reg_mr lkey), skipping the copy through
// the connection's bounce arena. Register long-lived buffer pools (the
// pager's staging slots), not per-request buffers: registration pins the
// pages and costs a system call and a page-table walk.
type LocalRegistrar interface {
	// RegisterLocal registers mem for direct transfers. Ranges must not
	// overlap; at most MaxLocal are registered per connection. Go memory
	// is pinned (runtime.Pinner) until deregistered or the Conn closes;
	// mmap'd memory must stay mapped as long.
	RegisterLocal(mem []byte) error
	// DeregisterLocal undoes RegisterLocal for exactly the same mem. It
	// fails with ErrLocalBusy while an outstanding request uses it.
	DeregisterLocal(mem []byte) error
}

// MaxLocal bounds the registered local ranges of one connection.
const MaxLocal = 16

// Errors of LocalRegistrar.
var (
	ErrLocalBusy       = errors.New("rdma: verbs: local memory in use by an outstanding request")
	ErrLocalOverlap    = errors.New("rdma: verbs: local memory overlaps a registered range")
	ErrLocalNotFound   = errors.New("rdma: verbs: local memory not registered")
	ErrTooManyLocal    = fmt.Errorf("rdma: verbs: more than %d registered local ranges", MaxLocal)
	errEmptyLocalRange = errors.New("rdma: verbs: RegisterLocal of empty memory")
)

var _ LocalRegistrar = (*conn)(nil)

// localMR is one registered local range [start, end).
type localMR struct {
	start, end uint64
	mr         *memRegion
	pin        *runtime.Pinner
}

func (l *localMR) release() {
	l.mr.deregister()
	l.pin.Unpin()
}

func (c *conn) RegisterLocal(mem []byte) error {
	if len(mem) == 0 {
		return errEmptyLocalRange
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return rdma.ErrClosed
	}
	if len(c.locals) >= MaxLocal {
		return ErrTooManyLocal
	}
	start := addrOf(mem)
	end := start + uint64(len(mem))
	for _, l := range c.locals {
		if start < l.end && l.start < end {
			return ErrLocalOverlap
		}
	}
	pin := new(runtime.Pinner)
	pin.Pin(&mem[0]) // no-op for memory the Go runtime does not manage
	mr, err := c.pd.register(mem, 0, true)
	if err != nil {
		pin.Unpin()
		return err
	}
	c.locals = append(c.locals, localMR{start: start, end: end, mr: mr, pin: pin})
	return nil
}

func (c *conn) DeregisterLocal(mem []byte) error {
	if len(mem) == 0 {
		return ErrLocalNotFound
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return rdma.ErrClosed
	}
	start := addrOf(mem)
	end := start + uint64(len(mem))
	for i, l := range c.locals {
		if l.start != start || l.end != end {
			continue
		}
		for seq := c.head; seq < c.tail; seq++ {
			if s := c.slot(seq); s.state != slotDone && len(s.wr.Local) > 0 {
				if a := addrOf(s.wr.Local); a >= start && a < end {
					return ErrLocalBusy
				}
			}
		}
		l.release()
		c.locals = append(c.locals[:i], c.locals[i+1:]...)
		return nil
	}
	return ErrLocalNotFound
}

// lookupLocal returns the lkey of the registered range holding all of b.
func (c *conn) lookupLocal(b []byte) (uint32, bool) {
	if len(c.locals) == 0 {
		return 0, false
	}
	start := addrOf(b)
	end := start + uint64(len(b))
	for i := range c.locals {
		if l := &c.locals[i]; start >= l.start && end <= l.end {
			return l.mr.lkey, true
		}
	}
	return 0, false
}
