package tcp

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"rmem/rdma"
	"rmem/rdma/internal/iovec"
	"rmem/rdma/internal/queue"
)

// maxRun bounds the reply headers the reader asks for in one readv.
const maxRun = 32

// Dial connects to a tcp Listener and performs the handshake within ctx.
func Dial(ctx context.Context, addr string, opts rdma.DialOptions) (rdma.Conn, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma/tcp: dial %s: %w: %w", addr, rdma.ErrTransport, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if opts.TLS != nil {
		nc = tls.Client(nc, opts.TLS)
	}
	if err := clientHandshake(ctx, nc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("rdma/tcp: dial %s: %w", addr, err)
	}
	depth := opts.QueueDepth()
	c := &conn{
		nc:     nc,
		q:      queue.New(depth),
		hdrs:   make([]byte, depth*reqSize),
		iov:    make([][]byte, 0, 2*depth),
		rd:     iovec.NewReader(nc),
		exited: make(chan struct{}),
	}
	go c.routineReadReplies()
	return c, nil
}

func clientHandshake(ctx context.Context, nc net.Conn) error {
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [helloSize]byte
	putHello(b[:], hello{Version: version, MaxTransfer: rdma.MaxTransfer})
	if _, err := nc.Write(b[:]); err != nil {
		return handshakeErr(ctx, err)
	}
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		return handshakeErr(ctx, err)
	}
	h, err := decodeHello(b[:])
	if err != nil {
		return err
	}
	if h.Version != version {
		return fmt.Errorf("%w: server speaks %d, we speak %d", rdma.ErrVersion, h.Version, version)
	}
	if !stop() {
		return ctx.Err()
	}
	return nc.SetDeadline(time.Time{})
}

func handshakeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: handshake: %w", rdma.ErrTransport, ctx.Err())
	}
	return fmt.Errorf("%w: handshake: %w", rdma.ErrTransport, err)
}

// conn is a client connection. Post writes requests from the caller's
// goroutine; routineReadReplies completes them.
type conn struct {
	nc net.Conn
	q  *queue.Queue

	wmu  sync.Mutex // serializes Post: ring order = wire order
	hdrs []byte     // request headers of one Post; guarded by wmu
	iov  [][]byte   // guarded by wmu
	bufs net.Buffers

	// Owned by routineReadReplies.
	rd   *iovec.Reader
	rhdr [maxRun * replySize]byte
	riov [maxRun + 1][]byte

	exited    chan struct{}
	closeOnce sync.Once
}

var _ rdma.Conn = (*conn)(nil)

// Post writes the batch with one writev (WRITE payloads straight from the
// callers' buffers). It may block while the socket's send buffer is full.
func (c *conn) Post(wrs []rdma.WorkRequest) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	first, err := c.q.Enqueue(wrs)
	if err != nil {
		return err
	}
	iov := c.iov[:0]
	run := -1 // start in hdrs of the header run in the last iovec
	for i := range wrs {
		wr := &wrs[i]
		off := i * reqSize
		putRequest(c.hdrs[off:off+reqSize], first+uint64(i), wr)
		if run >= 0 {
			iov[len(iov)-1] = c.hdrs[run : off+reqSize]
		} else {
			run = off
			iov = append(iov, c.hdrs[off:off+reqSize])
		}
		if wr.Op == rdma.OpWrite && len(wr.Local) > 0 {
			iov = append(iov, wr.Local)
			run = -1
		}
	}
	c.bufs = iov
	_, err = c.bufs.WriteTo(c.nc)
	clear(iov)
	c.iov = iov[:0]
	if err != nil {
		// Everything posted completes with StatusTransport.
		c.fail(err)
	}
	return nil
}

func (c *conn) Poll(cqes []rdma.Completion) (int, error) { return c.q.Poll(cqes) }

func (c *conn) Wait(ctx context.Context, cqes []rdma.Completion) (int, error) {
	return c.q.Wait(ctx, cqes)
}

// Close closes the connection and waits for its reader goroutine.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.q.Close()
		c.nc.Close()
	})
	<-c.exited
	return nil
}

func (c *conn) fail(err error) {
	c.q.Fail(err)
	c.nc.Close()
}

// routineReadReplies reads replies in order. A READ's payload is read
// straight into its Local buffer: after a READ header the next readv is
// [payload, following headers...]; headers of other ops are gathered
// several per readv, up to and including the next READ's header.
func (c *conn) routineReadReplies() {
	defer close(c.exited)
	var (
		seq   uint64 // the request whose reply is being read
		hfill int    // bytes of its header already in rhdr[0:]
		pay   []byte // remaining payload of seq (READ in payload phase), or nil
	)
	for {
		// Build the iovec.
		iov := c.riov[:0]
		next := seq
		if pay != nil {
			iov = append(iov, pay)
			next++
		}
		nh := 0
		for nh < maxRun {
			lo := nh * replySize
			if nh == 0 {
				lo += hfill
			}
			iov = append(iov, c.rhdr[lo:(nh+1)*replySize])
			nh++
			s, ok := c.q.Peek(next)
			if !ok || s.Op == rdma.OpRead {
				break // unknown op or a READ: its payload comes next
			}
			next++
		}
		n, err := c.rd.Readv(iov, true)
		if err != nil {
			c.fail(err)
			return
		}
		// Consume.
		if pay != nil {
			m := min(n, len(pay))
			n -= m
			pay = pay[m:]
			if len(pay) > 0 {
				continue
			}
			pay = nil
			c.q.Complete(rdma.StatusOK, c.curLen(seq), 0)
			seq++
		}
		for h := 0; n > 0; h++ {
			need := replySize
			if h == 0 {
				need -= hfill
			}
			if n < need {
				// Partial header: move it to the front.
				lo := h * replySize
				filled := replySize - need + n
				copy(c.rhdr[:filled], c.rhdr[lo:lo+filled])
				hfill = filled
				break
			}
			n -= need
			hfill = 0
			s, ok := c.q.Peek(seq)
			if !ok {
				c.fail(fmt.Errorf("%w: reply %d to no request", rdma.ErrProtocol, seq))
				return
			}
			rep, err := decodeReply(c.rhdr[h*replySize:(h+1)*replySize], seq, s.Op, len(s.Local))
			if err != nil {
				c.fail(err)
				return
			}
			if rep.Op == rdma.OpRead && rep.Status == rdma.StatusOK && rep.Length > 0 {
				pay = s.Local[:rep.Length]
				continue // n is 0 here: the iovec stopped after this header
			}
			c.q.Complete(rep.Status, rep.Length, rep.Value)
			seq++
		}
	}
}

// curLen is the length of the READ being completed.
func (c *conn) curLen(seq uint64) uint32 {
	s, _ := c.q.Peek(seq)
	return uint32(len(s.Local))
}
