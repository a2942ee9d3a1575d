package tcp

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"rmem/rdma"
	"rmem/rdma/internal/atomicmem"
	"rmem/rdma/internal/connset"
	"rmem/rdma/internal/iovec"
	"rmem/spin"
)

const (
	// rbufSize is the server's request buffer: many pipelined headers are
	// read with one syscall.
	rbufSize = 64 << 10
	// maxPending bounds the replies (and READ holds) gathered before one
	// writev.
	maxPending = 64
	// maxPendingBytes flushes replies once this much READ payload is queued.
	maxPendingBytes = 512 << 10
	// helloTimeout bounds the handshake of an accepted connection.
	helloTimeout = 10 * time.Second
)

// Listener serves a Domain over TCP.
type Listener struct {
	ln    net.Listener
	d     *rdma.Domain
	conns *connset.Set
	spin  time.Duration // each connection's longest spin
	site  *spin.Site    // where their spinning is counted (nil: nowhere)
}

// Listen serves d at addr ("host:port"; port 0 picks one).
func Listen(addr string, d *rdma.Domain, opts rdma.ListenOptions) (*Listener, error) {
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("rdma/tcp: ListenOptions.MaxConns %d < 0", opts.MaxConns)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma/tcp: listen %s: %w", addr, err)
	}
	if opts.TLS != nil {
		ln = tls.NewListener(ln, opts.TLS)
	}
	l := &Listener{ln: ln, d: d, spin: spin.Resolve(opts.Spin), site: opts.SpinSite}
	l.conns = connset.Serve(ln, opts.MaxConns, l.open)
	return l, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for all of the
// listener's goroutines. Safe to call twice.
func (l *Listener) Close() error { return l.conns.Close() }

// Conns returns the number of connections being served.
func (l *Listener) Conns() int { return l.conns.Len() }

func (l *Listener) open(nc net.Conn) (connset.Conn, error) {
	return newServerConn(nc, l.d, spin.New(l.spin, l.site)), nil
}

// Serve and Shutdown make a serverConn a connset.Conn.
func (c *serverConn) Serve()    { c.routineServe() }
func (c *serverConn) Shutdown() { c.nc.Close() }

// serverConn executes one client's requests in order. One goroutine
// (routineServe) owns all of its fields.
type serverConn struct {
	nc   net.Conn
	rd   *iovec.Reader
	wr   *iovec.Writer
	sess *rdma.Session

	rbuf [rbufSize]byte
	r, w int // unread bytes are rbuf[r:w]
	// lastWrite: the previous request was a WRITE, so read one header at a
	// time and let the next payload go straight to the region.
	lastWrite bool
	streaming bool // the last read filled its buffers: more is likely waiting
	spin      *spin.Waiter

	replies   [maxPending * replySize]byte
	nreplies  int
	hdrRun    int      // offset in replies where the last iovec's header run starts, or -1
	iov       [][]byte // pending writev: reply headers and READ payloads
	bufs      net.Buffers
	holds     [maxPending]rdma.Hold
	nholds    int
	pendBytes int
	riov      [2][]byte
	scratch   []byte // sink for the payload of a refused WRITE
}

func newServerConn(nc net.Conn, d *rdma.Domain, w *spin.Waiter) *serverConn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &serverConn{nc: nc, rd: iovec.NewReader(nc), wr: iovec.NewWriter(nc), iov: make([][]byte, 0, 2*maxPending), hdrRun: -1,
		spin: w}
	c.sess = d.NewSession(rdma.SessionHooks{Abort: func() { nc.Close() }})
	return c
}

// routineServe serves the connection until it fails or is closed.
func (c *serverConn) routineServe() {
	defer func() {
		c.releaseHolds()
		c.sess.Close()
		c.nc.Close()
	}()
	if err := c.handshake(); err != nil {
		return
	}
	for {
		if err := c.serveOne(); err != nil {
			c.flush() // best effort: replies to the good requests before the bad one
			return
		}
	}
}

func (c *serverConn) handshake() error {
	c.nc.SetDeadline(time.Now().Add(helloTimeout))
	var b [helloSize]byte
	if _, err := io.ReadFull(c.nc, b[:]); err != nil {
		return err
	}
	h, err := decodeHello(b[:])
	if err != nil {
		return err
	}
	putHello(b[:], hello{Version: version, MaxTransfer: rdma.MaxTransfer})
	if _, err := c.nc.Write(b[:]); err != nil {
		return err
	}
	if h.Version != version {
		return fmt.Errorf("%w: client speaks %d", rdma.ErrVersion, h.Version)
	}
	return c.nc.SetDeadline(time.Time{})
}

// read reads into bufs; pending replies go out before it may block. If the
// previous read filled all its buffers, the client is streaming and more
// requests are probably waiting: try a non-blocking read first, so that
// replies keep gathering into one writev. Otherwise (request/response)
// flush first, saving the syscall that would find nothing.
func (c *serverConn) read(bufs [][]byte) (int, error) {
	var n int
	err := iovec.ErrWouldBlock
	if c.streaming {
		n, err = c.rd.Readv(bufs, false)
	}
	if err == iovec.ErrWouldBlock {
		if err := c.flush(); err != nil {
			return 0, err
		}
		// Poll a while first: the next request of a client that is
		// faulting comes within µs, and a wake-up costs tens of them.
		start, until := c.spin.Start()
		for err == iovec.ErrWouldBlock && c.spin.Polling(until) {
			n, err = c.rd.Readv(bufs, false)
		}
		hit := err != iovec.ErrWouldBlock
		if !hit {
			n, err = c.rd.Readv(bufs, true)
		}
		c.spin.Done(start, until, hit)
	}
	if err != nil {
		return n, err
	}
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	c.streaming = n == total
	return n, nil
}

// fillHeader makes rbuf[r:w] hold at least one request header.
func (c *serverConn) fillHeader() error {
	for c.w-c.r < reqSize {
		if c.r > 0 && len(c.rbuf)-c.r < reqSize {
			c.w = copy(c.rbuf[:], c.rbuf[c.r:c.w])
			c.r = 0
		}
		end := len(c.rbuf)
		if c.lastWrite {
			end = c.r + reqSize
		}
		c.riov[0] = c.rbuf[c.w:end]
		n, err := c.read(c.riov[:1])
		if err != nil {
			return err
		}
		c.w += n
	}
	return nil
}

func (c *serverConn) serveOne() error {
	if err := c.fillHeader(); err != nil {
		return err
	}
	req, err := decodeRequest(c.rbuf[c.r : c.r+reqSize])
	if err != nil {
		return err
	}
	c.r += reqSize
	if c.r == c.w {
		c.r, c.w = 0, 0
	}
	rep := reply{Op: req.Op, ID: req.ID}
	c.lastWrite = req.Op == rdma.OpWrite
	switch req.Op {
	case rdma.OpRead:
		h, st := c.sess.Begin(req.Key, req.Op, req.Offset, int(req.Length))
		rep.Status = st
		if st == rdma.StatusOK {
			rep.Length = req.Length
			c.queueReply(rep, h)
		} else {
			c.queueReply(rep, rdma.Hold{})
		}
	case rdma.OpWrite:
		// RC ordering: READ replies still queued must carry the data from
		// before this WRITE, so send them first.
		if err := c.flushReads(); err != nil {
			return err
		}
		h, st := c.sess.Begin(req.Key, req.Op, req.Offset, int(req.Length))
		rep.Status = st
		if st == rdma.StatusOK {
			err := c.readPayload(h.Mem)
			c.sess.End(h)
			if err != nil {
				return err
			}
			rep.Length = req.Length
		} else if err := c.discard(int(req.Length)); err != nil {
			return err
		}
		c.queueReply(rep, rdma.Hold{})
	case rdma.OpCompareSwap, rdma.OpFetchAdd:
		if err := c.flushReads(); err != nil {
			return err
		}
		h, st := c.sess.Begin(req.Key, req.Op, req.Offset, rdma.AtomicSize)
		rep.Status = st
		if st == rdma.StatusOK {
			if req.Op == rdma.OpCompareSwap {
				rep.Value = atomicmem.CompareAndSwap(h.Mem, req.Compare, req.Operand)
			} else {
				rep.Value = atomicmem.FetchAdd(h.Mem, req.Operand)
			}
			c.sess.End(h)
			rep.Length = rdma.AtomicSize
		}
		c.queueReply(rep, rdma.Hold{})
	}
	if c.nreplies == maxPending || c.pendBytes >= maxPendingBytes {
		return c.flush()
	}
	return nil
}

// readPayload fills dst (region memory) with the WRITE payload: what is
// already buffered is copied, the rest is read straight into dst together
// with the next request header.
func (c *serverConn) readPayload(dst []byte) error {
	k := copy(dst, c.rbuf[c.r:c.w])
	c.r += k
	if c.r == c.w {
		c.r, c.w = 0, 0
	}
	for k < len(dst) {
		// Here rbuf is empty (r == w == 0): the next header may follow.
		c.riov[0] = dst[k:]
		c.riov[1] = c.rbuf[:reqSize]
		n, err := c.read(c.riov[:2])
		if err != nil {
			return err
		}
		m := min(n, len(dst)-k)
		k += m
		c.w += n - m
	}
	return nil
}

// discard consumes n payload bytes of a refused WRITE.
func (c *serverConn) discard(n int) error {
	k := min(n, c.w-c.r)
	c.r += k
	if c.r == c.w {
		c.r, c.w = 0, 0
	}
	n -= k
	if n > 0 && c.scratch == nil {
		c.scratch = make([]byte, 64<<10)
	}
	for n > 0 {
		c.riov[0] = c.scratch[:min(n, len(c.scratch))]
		m, err := c.read(c.riov[:1])
		if err != nil {
			return err
		}
		n -= m
	}
	return nil
}

// queueReply appends a reply (and, for a READ, its payload straight from
// the region, pinned by h until the flush). Consecutive headers share one
// iovec.
func (c *serverConn) queueReply(rep reply, h rdma.Hold) {
	off := c.nreplies * replySize
	putReply(c.replies[off:off+replySize], rep)
	c.nreplies++
	if c.hdrRun >= 0 {
		c.iov[len(c.iov)-1] = c.replies[c.hdrRun : off+replySize]
	} else {
		c.hdrRun = off
		c.iov = append(c.iov, c.replies[off:off+replySize])
	}
	if rep.Op == rdma.OpRead && rep.Status == rdma.StatusOK {
		if len(h.Mem) > 0 {
			c.iov = append(c.iov, h.Mem)
			c.pendBytes += len(h.Mem)
			c.hdrRun = -1
		}
		c.holds[c.nholds] = h
		c.nholds++
	}
}

// flushReads flushes if a READ payload is waiting to be sent.
func (c *serverConn) flushReads() error {
	if c.nholds == 0 {
		return nil
	}
	return c.flush()
}

// flush writes pending replies with one writev and releases READ holds.
func (c *serverConn) flush() error {
	if len(c.iov) == 0 {
		return nil
	}
	var err error
	if c.wr.Vectored() {
		for iov := c.iov; len(iov) > 0 && err == nil; {
			var n int
			n, err = c.wr.Writev(iov, true)
			iov = iovec.Advance(iov, n)
		}
	} else {
		c.bufs = c.iov
		_, err = c.bufs.WriteTo(c.nc)
	}
	clear(c.iov) // drop references to region memory
	c.iov = c.iov[:0]
	c.nreplies, c.pendBytes, c.hdrRun = 0, 0, -1
	c.releaseHolds()
	return err
}

func (c *serverConn) releaseHolds() {
	for i := range c.nholds {
		c.sess.End(c.holds[i])
		c.holds[i] = rdma.Hold{}
	}
	c.nholds = 0
}
