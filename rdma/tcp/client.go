package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"rmem/rdma"
	"rmem/rdma/internal/iovec"
	"rmem/rdma/internal/queue"
	"rmem/spin"

	"golang.org/x/sys/unix"
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
		cfg := opts.TLS
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			// As tls.Dial does: verify the certificate against the host
			// we dialed.
			host, _, _ := net.SplitHostPort(addr)
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		nc = tls.Client(nc, cfg)
	}
	if err := clientHandshake(ctx, nc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("rdma/tcp: dial %s: %w", addr, err)
	}
	c, err := newConn(nc, opts.QueueDepth(), spin.New(spin.Resolve(opts.Spin), opts.SpinSite), opts.ThreadWait)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("rdma/tcp: dial %s: %w: %w", addr, rdma.ErrTransport, err)
	}
	return c, nil
}

// newConn wraps a connection whose handshake is done; it polls for
// replies as w decides. With threadWait, Wait blocks the
// thread in poll(2), and a TCP socket leaves Go's netpoller: out of it, a
// reply wakes nobody but the thread that polls for it (262,144 random
// reads over tcp at 32 MiB local, same session: 22.0-23.6 s -> 20.7-21.3 s).
func newConn(nc net.Conn, depth int, w *spin.Waiter, threadWait bool) (*conn, error) {
	c := &conn{
		nc:   nc,
		fd:   -1,
		q:    queue.New(depth),
		hdrs: make([]byte, depth*reqSize),
		iov:  make([][]byte, 0, 2*depth),
		spin: w,
	}
	if _, ok := nc.(*net.TCPConn); ok && threadWait {
		fd, err := iovec.Detach(nc)
		if err != nil {
			return nil, err
		}
		c.fd = fd
		c.rd, c.wr = iovec.NewReaderFD(fd), iovec.NewWriterFD(fd)
		return c, nil
	}
	c.rd, c.wr = iovec.NewReader(nc), iovec.NewWriter(nc)
	c.rd.SetThreadWait(threadWait)
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
// goroutine; Wait and Poll read the replies in the caller's goroutine too
// (as verbs polls a CQ in the caller's thread): there is no background
// goroutine, so a completion costs no goroutine hand-off.
type conn struct {
	nc net.Conn // closed already if fd >= 0
	fd int      // the socket taken out of the netpoller (ThreadWait), or -1

	fdMu     sync.Mutex
	fdClosed bool // fd is closed (by Close); guarded by fdMu
	q        *queue.Queue

	wmu  sync.Mutex // serializes Post: ring order = wire order
	hdrs []byte     // request headers of one Post; guarded by wmu
	iov  [][]byte   // guarded by wmu
	wr   *iovec.Writer
	bufs net.Buffers // TLS path

	// rmu is the reader token: whoever holds it reads replies. The fields
	// below are guarded by rmu.
	rmu   sync.Mutex
	rd    *iovec.Reader
	rhdr  [maxRun * replySize]byte
	riov  [iovec.MaxBufs][]byte
	segs  [iovec.MaxBufs]seg
	seq   uint64 // the request whose reply is being parsed
	tail  uint64 // a recent q.Tail(): requests below it may be read with q.At
	hfill int    // header bytes of seq already in rhdr[0:hfill]
	inPay bool   // seq's header said OK: its payload is being read
	pfill int    // payload bytes of seq already in its Local
	spill []byte // misplaced bytes after a speculation failed (rare)
	spin  *spin.Waiter

	closeOnce sync.Once
}

// seg describes one iovec of a readv: a reply header in rhdr, or the
// payload of a READ in its Local buffer.
type seg struct {
	seq  uint64
	hdr  bool
	off  int    // header: offset in rhdr; payload: offset in Local
	b    []byte // the iovec itself
	spec bool   // payload read before its header was decoded
}

var _ rdma.Conn = (*conn)(nil)

// Post writes the batch with one writev (WRITE payloads straight from the
// callers' buffers). While the socket's send buffer is full it reads
// replies instead of blocking on the server (over TLS it blocks).
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
	used := len(iov)
	err = c.writeLocked(iov)
	clear(c.iov[:used]) // drop references to the callers' buffers
	c.iov = c.iov[:0]
	if err != nil {
		// Everything posted completes with StatusTransport.
		c.fail(err)
	}
	return nil
}

// writeLocked writes iov without ever blocking on a full socket while
// replies wait to be read: if the server is blocked writing replies that
// nobody reads (this goroutine is the one that would read them), the
// client must read to let it make progress, as a NIC would. Over TLS the
// write blocks (documented). Preconditions: c.wmu must be held.
func (c *conn) writeLocked(iov [][]byte) error {
	if !c.wr.Vectored() {
		c.bufs = iov
		_, err := c.bufs.WriteTo(c.nc)
		return err
	}
	for len(iov) > 0 {
		n, err := c.wr.Writev(iov, false)
		iov = iovec.Advance(iov, n)
		if err == nil {
			continue
		}
		if err != iovec.ErrWouldBlock {
			return err
		}
		canRead := c.q.Pending()
		readable, _, err := c.wr.Poll(canRead, 5*time.Millisecond)
		if err != nil {
			return err
		}
		if readable && c.rmu.TryLock() {
			err := c.drainLocked()
			c.rmu.Unlock()
			c.q.Wake()
			if err != nil {
				return err
			}
		} else if readable {
			// Another goroutine is reading: just wait for room.
			if _, _, err := c.wr.Poll(false, 5*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// drainLocked reads the replies that have arrived, without blocking.
// Preconditions: c.rmu must be held.
func (c *conn) drainLocked() error {
	for c.q.Pending() {
		if _, err := c.readOnce(false); err != nil {
			if err == iovec.ErrWouldBlock {
				return nil
			}
			return err
		}
	}
	return nil
}

// Poll reads the replies that have arrived, without blocking.
func (c *conn) Poll(cqes []rdma.Completion) (int, error) {
	if c.q.Pending() && c.rmu.TryLock() {
		err := c.drainLocked()
		c.rmu.Unlock()
		c.q.Wake()
		if err != nil {
			c.fail(err)
		}
	}
	return c.q.Poll(cqes)
}

// Wait returns completions, reading replies in the caller's goroutine. It
// does not allocate when ctx has no Done channel or has a deadline; a
// cancel-only ctx costs one context.AfterFunc per blocking read.
func (c *conn) Wait(ctx context.Context, cqes []rdma.Completion) (int, error) {
	if len(cqes) == 0 {
		return 0, nil
	}
	for {
		n, pending, err := c.q.Check(cqes)
		if n > 0 || err != nil {
			return n, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if pending && c.rmu.TryLock() {
			err := c.readUntilProgress(ctx)
			c.rmu.Unlock()
			c.q.Wake() // another waiter may take over reading
			// A deadline error is ctx ending (we set no other deadline):
			// the loop returns ctx.Err().
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				c.fail(err)
			}
			continue
		}
		if err := c.q.WaitEvent(ctx); err != nil {
			return 0, err
		}
	}
}

// readUntilProgress blocks until at least one request completes.
// Preconditions: c.rmu must be held.
func (c *conn) readUntilProgress(ctx context.Context) error {
	dl, hasDL := ctx.Deadline()
	if err := c.rd.SetDeadline(dl); err != nil {
		return err
	}
	if ctx.Done() != nil && !hasDL {
		stop := context.AfterFunc(ctx, c.rd.Interrupt)
		defer func() {
			if !stop() {
				c.rd.MarkDirty()
			}
		}()
	}
	// Poll a while first: a reply that comes soon costs no wake-up.
	start, until := c.spin.Start()
	for c.spin.Polling(until) {
		progress, err := c.readOnce(false)
		if err == iovec.ErrWouldBlock {
			continue
		}
		if err != nil || progress {
			c.spin.Done(start, until, true)
			return err
		}
	}
	defer c.spin.Done(start, until, false)
	for {
		progress, err := c.readOnce(true)
		if err != nil || progress {
			return err
		}
		if !c.q.Pending() {
			return nil
		}
	}
}

// Close closes the connection. Safe to call twice.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.q.Close()
		c.closeNC()
		if c.fd >= 0 {
			// Once no call is in a system call on it: the number
			// may be reused at once.
			c.wmu.Lock()
			c.rmu.Lock()
			c.fdMu.Lock()
			unix.Close(c.fd)
			c.fdClosed = true
			c.fdMu.Unlock()
			c.rmu.Unlock()
			c.wmu.Unlock()
		}
	})
	return nil
}

func (c *conn) fail(err error) {
	c.q.Fail(err)
	c.closeNC()
}

// closeNC closes the socket. A reader waiting in poll(2) (thread wait)
// holds a reference that net.Conn.Close waits for: shutting the read side
// down first wakes it at once. A detached socket is only shut down here
// (every call on it then fails at once); Close closes it.
func (c *conn) closeNC() {
	if c.fd >= 0 {
		c.fdMu.Lock()
		if !c.fdClosed { // a fail after Close must not shut a reused number down
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
		c.fdMu.Unlock()
		c.rd.Interrupt()
		return
	}
	if tc, ok := c.nc.(*net.TCPConn); ok {
		tc.CloseRead()
	}
	c.rd.Interrupt()
	c.nc.Close()
}

// readOnce does one readv of replies and parses it. Payloads are read
// straight into the requests' Local buffers: the iovec is built from the
// posted requests, [header, Local] for a READ (speculating status OK) and
// [header] for other ops, up to the first request not yet posted. If a
// READ turns out to have failed, the bytes read into its Local belong to
// later replies: they are moved out and parsed from a copy.
// Preconditions: c.rmu must be held.
func (c *conn) readOnce(wait bool) (progress bool, err error) {
	nseg := 0
	seq := c.seq
	add := func(s seg, b []byte) {
		s.b = b
		c.segs[nseg] = s
		c.riov[nseg] = b
		nseg++
	}
	nh := 0
	c.tail = c.q.Tail()
	if c.inPay {
		s := c.q.At(seq)
		add(seg{seq: seq, off: c.pfill}, s.Local[c.pfill:])
		seq++
	}
	for nh < maxRun && nseg+2 <= len(c.segs) {
		lo := nh * replySize
		if nh == 0 && !c.inPay {
			lo += c.hfill
		}
		add(seg{seq: seq, hdr: true, off: lo}, c.rhdr[lo:(nh+1)*replySize])
		nh++
		if seq >= c.tail {
			break // not posted yet: its op (and payload) is unknown
		}
		s := c.q.At(seq)
		if s.Op == rdma.OpRead && len(s.Local) > 0 {
			add(seg{seq: seq, spec: true}, s.Local)
		}
		seq++
	}
	n, err := c.rd.Readv(c.riov[:nseg], wait)
	clear(c.riov[:nseg])
	if err == nil {
		progress, err = c.consume(n)
	}
	for i := range nseg {
		c.segs[i].b = nil // drop references to callers' buffers
	}
	return progress, err
}

// consume parses the n bytes the last readv placed according to c.segs.
func (c *conn) consume(n int) (progress bool, err error) {
	for i := 0; n > 0; i++ {
		sg := &c.segs[i]
		sn := len(sg.b)
		take := min(n, sn)
		n -= take
		if !sg.hdr {
			// Payload of a READ whose header said OK.
			c.pfill += take
			if take < sn {
				return progress, nil
			}
			c.q.Complete(rdma.StatusOK, uint32(c.pfill), 0)
			c.seq++
			c.inPay, c.pfill = false, 0
			progress = true
			continue
		}
		if take < sn {
			// Partial header: move it to the front for the next readv.
			filled := replySize - sn + take
			start := sg.off - (replySize - sn)
			copy(c.rhdr[:filled], c.rhdr[start:start+filled])
			c.hfill = filled
			return progress, nil
		}
		c.hfill = 0
		hdrStart := sg.off - (replySize - sn)
		ok, err := c.handleHeader(c.rhdr[hdrStart : hdrStart+replySize])
		if err != nil {
			return progress, err
		}
		if c.inPay {
			continue // the next segment is its payload, already in place
		}
		progress = progress || ok
		if i+1 < len(c.segs) && n > 0 && c.segs[i+1].spec && c.segs[i+1].seq == sg.seq {
			// The READ failed but we read on into its Local: those bytes
			// are the following replies. Gather and parse them.
			return true, c.respill(i+1, n)
		}
	}
	return progress, nil
}

// handleHeader decodes the reply header of c.seq and completes it, or
// enters its payload phase. ok reports a completion.
func (c *conn) handleHeader(h []byte) (ok bool, err error) {
	if c.seq >= c.tail {
		c.tail = c.q.Tail() // posted since the readv was built?
		if c.seq >= c.tail {
			return false, fmt.Errorf("%w: reply %d to no request", rdma.ErrProtocol, c.seq)
		}
	}
	s := c.q.At(c.seq)
	rep, err := decodeReply(h, c.seq, s.Op, len(s.Local))
	if err != nil {
		return false, err
	}
	if rep.Op == rdma.OpRead && rep.Status == rdma.StatusOK && rep.Length > 0 {
		c.inPay, c.pfill = true, 0
		return false, nil
	}
	c.q.Complete(rep.Status, rep.Length, rep.Value)
	c.seq++
	return true, nil
}

// respill copies the n bytes that landed in segments from i on into the
// spill buffer and parses them byte-stream style.
func (c *conn) respill(i, n int) error {
	if cap(c.spill) < n {
		c.spill = make([]byte, 0, max(n, 64<<10))
	}
	buf := c.spill[:0]
	for ; n > 0; i++ {
		take := min(n, len(c.segs[i].b))
		buf = append(buf, c.segs[i].b[:take]...)
		n -= take
	}
	return c.feed(buf)
}

// feed parses a byte stream of replies, copying payloads to their Local.
func (c *conn) feed(b []byte) error {
	for len(b) > 0 {
		if c.inPay {
			s := c.q.At(c.seq)
			k := copy(s.Local[c.pfill:], b)
			b = b[k:]
			c.pfill += k
			if c.pfill == len(s.Local) {
				c.q.Complete(rdma.StatusOK, uint32(c.pfill), 0)
				c.seq++
				c.inPay, c.pfill = false, 0
			}
			continue
		}
		k := copy(c.rhdr[c.hfill:replySize], b)
		b = b[k:]
		c.hfill += k
		if c.hfill < replySize {
			return nil
		}
		c.hfill = 0
		if _, err := c.handleHeader(c.rhdr[:replySize]); err != nil {
			return err
		}
	}
	return nil
}
