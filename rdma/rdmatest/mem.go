package rdmatest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"rmem/rdma"
	"rmem/rdma/internal/atomicmem"
	"rmem/rdma/internal/queue"
)

// Network is the provider name of the in-memory provider.
const Network = "mem"

func init() { rdma.RegisterProvider(Network, provider{}) }

var (
	errBroken = errors.New("rdmatest: connection broken")

	registryMu sync.Mutex
	registry   = map[string]*Listener{}
	nextAddr   int
)

type provider struct{}

// Listen serves d at the name addr ("" picks a unique name).
func (provider) Listen(addr string, d *rdma.Domain, opts rdma.ListenOptions) (rdma.Listener, error) {
	return Listen(addr, d, opts)
}

// Listener is an in-memory listener.
type Listener struct {
	addr string
	d    *rdma.Domain
	max  int

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
}

// Listen serves d under the name addr ("" picks a unique name).
func Listen(addr string, d *rdma.Domain, opts rdma.ListenOptions) (*Listener, error) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if addr == "" {
		nextAddr++
		addr = "mem-" + strconv.Itoa(nextAddr)
	}
	if _, dup := registry[addr]; dup {
		return nil, fmt.Errorf("rdmatest: listen %q: address in use", addr)
	}
	l := &Listener{addr: addr, d: d, max: opts.MaxConns, conns: map[*conn]struct{}{}}
	registry[addr] = l
	return l, nil
}

// Addr returns the name clients dial.
func (l *Listener) Addr() string { return l.addr }

// Break fails every current connection (a transport failure); the listener
// keeps accepting new ones.
func (l *Listener) Break() {
	l.mu.Lock()
	conns := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	clear(l.conns)
	l.mu.Unlock()
	for _, c := range conns {
		c.fail(errBroken)
	}
}

// Close stops listening and breaks every connection. Safe to call twice.
func (l *Listener) Close() error {
	registryMu.Lock()
	if registry[l.addr] == l {
		delete(registry, l.addr)
	}
	registryMu.Unlock()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.Break()
	return nil
}

func (provider) Dial(ctx context.Context, addr string, opts rdma.DialOptions) (rdma.Conn, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	registryMu.Lock()
	l := registry[addr]
	registryMu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("rdmatest: dial %q: %w: no listener", addr, rdma.ErrTransport)
	}
	c := &conn{q: queue.New(opts.QueueDepth())}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("rdmatest: dial %q: %w: listener closed", addr, rdma.ErrTransport)
	}
	if l.max > 0 && len(l.conns) >= l.max {
		return nil, fmt.Errorf("rdmatest: dial %q: %w: too many connections", addr, rdma.ErrTransport)
	}
	c.l = l
	c.sess = l.d.NewSession(rdma.SessionHooks{Abort: func() { c.fail(errBroken) }})
	l.conns[c] = struct{}{}
	return c, nil
}

// conn executes ops synchronously in Post.
type conn struct {
	q    *queue.Queue
	l    *Listener
	sess *rdma.Session

	postMu sync.Mutex // serializes Post (ring order = execution order)
	failMu sync.Mutex
	failed bool
}

func (c *conn) fail(cause error) {
	c.failMu.Lock()
	defer c.failMu.Unlock()
	if c.failed {
		return
	}
	c.failed = true
	c.q.Fail(cause)
	c.sess.Close()
}

func (c *conn) Post(wrs []rdma.WorkRequest) error {
	c.postMu.Lock()
	defer c.postMu.Unlock()
	if _, err := c.q.Enqueue(wrs); err != nil {
		return err
	}
	for i := range wrs {
		st, n, v := Execute(c.sess, &wrs[i])
		c.q.Complete(st, n, v)
	}
	return nil
}

func (c *conn) Poll(cqes []rdma.Completion) (int, error) { return c.q.Poll(cqes) }

func (c *conn) Wait(ctx context.Context, cqes []rdma.Completion) (int, error) {
	return c.q.Wait(ctx, cqes)
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	c.fail(rdma.ErrClosed)
	c.q.Close()
	return nil
}

// Execute runs one work request against the session's domain, as a server
// that executes ops itself does. It does not allocate.
func Execute(s *rdma.Session, wr *rdma.WorkRequest) (st rdma.Status, n uint32, value uint64) {
	h, st := s.Begin(wr.Key, wr.Op, wr.Offset, wr.Len())
	if st != rdma.StatusOK {
		return st, 0, 0
	}
	defer s.End(h)
	switch wr.Op {
	case rdma.OpRead:
		copy(wr.Local, h.Mem)
	case rdma.OpWrite:
		copy(h.Mem, wr.Local)
	case rdma.OpCompareSwap:
		value = atomicmem.CompareAndSwap(h.Mem, wr.Compare, wr.Swap)
	case rdma.OpFetchAdd:
		value = atomicmem.FetchAdd(h.Mem, wr.Add)
	}
	return rdma.StatusOK, uint32(len(h.Mem)), value
}

// Server is a Domain with one registered region of heap memory served by
// the mem provider: the usual fixture of a pager unit test.
type Server struct {
	Domain   *rdma.Domain
	Region   *rdma.Region
	Listener *Listener
}

// NewServer returns a Server with a zeroed region of size bytes; it is
// closed by tb.Cleanup.
func NewServer(tb testing.TB, size int) *Server {
	tb.Helper()
	d := rdma.NewDomain(rdma.DomainOptions{})
	r := rdma.NewRegion(make([]byte, size))
	if err := d.Register(r); err != nil {
		tb.Fatal(err)
	}
	l, err := Listen("", d, rdma.ListenOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return &Server{Domain: d, Region: r, Listener: l}
}

// Key issues a key for [off, off+length) of the server's region.
func (s *Server) Key(tb testing.TB, off, length uint64, acc rdma.Access) rdma.Key {
	tb.Helper()
	k, err := s.Domain.IssueKey(s.Region, off, length, acc)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// Dial connects to the server; the Conn is closed by tb.Cleanup.
func (s *Server) Dial(tb testing.TB, opts rdma.DialOptions) rdma.Conn {
	tb.Helper()
	c, err := rdma.Dial(context.Background(), Network, s.Listener.Addr(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}
