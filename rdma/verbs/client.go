//go:build verbs

package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
)

// ctrlTimeout bounds one control round trip (RESOLVE, RECONNECT).
const ctrlTimeout = 10 * time.Second

// revokedKey stands for any revoked key.
var revokedKey = &remoteKey{status: rdma.StatusRevokedKey}

// remoteKey is what the client knows of an rmem key: the verbs rkey and
// address of the MR the server registered for it, or that it is revoked.
type remoteKey struct {
	status rdma.Status // StatusOK or StatusRevokedKey
	access rdma.Access
	rkey   uint32
	addr   uint64
	len    uint64
}

type slotState uint8

const (
	slotQueued slotState = 1 + iota // accepted, not on the QP (yet, or again after a flush)
	slotPosted                      // on the QP
	slotDone                        // completion ready
)

// slot is one outstanding request, from Post until Poll returns it.
type slot struct {
	state    slotState
	wr       rdma.WorkRequest
	rk       *remoteKey
	status   rdma.Status
	n        uint32
	value    uint64
	staged   bool
	direct   bool   // Local is in registered memory: no bounce copy
	lkey     uint32 // Local's lkey when direct
	stageOff uint64 // offset of the bounce buffer in the arena
	stageEnd uint64 // arena head after the allocation (frees up to here)
}

// conn is a client connection: one RC QP, its CQ and the control socket.
type conn struct {
	mu     sync.Mutex
	ctrl   net.Conn
	ctrlFd int
	cbuf   [msgSize]byte

	dev *device
	pd  *protDomain
	cq  *complQueue
	qp  *queuePair

	// arena is the registered bounce memory: stage (the ring of READ and
	// WRITE buffers) followed by one 8-byte atomic result per slot.
	arena   []byte
	stage   []byte
	atom    []byte
	arenaMR *memRegion

	depth int
	slots []slot
	// Sequence numbers: [head, tail) are outstanding; [nextPost, tail)
	// holds no posted slot; fseq is the oldest slot whose bounce buffer
	// is not yet freed. head <= fseq, hwHead <= nextPost.
	head, tail, nextPost, fseq, hwHead uint64
	nposted                            int
	aHead, aTail                       uint64 // arena ring counters

	locals []localMR // memory the caller registered (RegisterLocal)

	keys map[rdma.Key]*remoteKey // live keys this connection resolved
	rks  []*remoteKey            // Post's scratch: the batch's keys
	wbuf []cWR
	wcs  []cWC
	pfds [2]unix.PollFd

	broken bool  // the QP saw an error: reconnect once nothing is posted
	failed error // transport failure (wraps rdma.ErrTransport)
	closed bool
}

var _ rdma.Conn = (*conn)(nil)

func dial(ctx context.Context, addr string, opts rdma.DialOptions, cfg Config) (_ *conn, err error) {
	depth := opts.QueueDepth()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma: verbs: dial %s: %w", addr, err)
	}
	c := &conn{ctrl: nc, depth: depth, keys: map[rdma.Key]*remoteKey{}}
	defer func() {
		if err != nil {
			c.teardown()
		}
	}()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		rc, err := tc.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("rdma: verbs: control socket: %w", err)
		}
		rc.Control(func(fd uintptr) { c.ctrlFd = int(fd) })
	}
	c.dev, err = openFor(nc.LocalAddr(), cfg)
	if err != nil {
		return nil, err
	}
	if depth > c.dev.maxQPWr {
		return nil, fmt.Errorf("rdma: verbs: depth %d exceeds the device's max_qp_wr %d", depth, c.dev.maxQPWr)
	}
	if c.pd, err = c.dev.allocPD(); err != nil {
		return nil, err
	}
	if c.cq, err = c.dev.createCQ(min(depth+1, c.dev.maxCQE)); err != nil {
		return nil, err
	}
	stageSize := max(2*rdma.MaxTransfer, depth*8192)
	c.arena, err = unix.Mmap(-1, 0, stageSize+depth*8, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("rdma: verbs: mmap bounce arena: %w", err)
	}
	c.stage, c.atom = c.arena[:stageSize:stageSize], c.arena[stageSize:]
	if c.arenaMR, err = c.pd.register(c.arena, 0, true); err != nil {
		return nil, err
	}
	c.slots = make([]slot, depth)
	c.wbuf = make([]cWR, depth)
	c.rks = make([]*remoteKey, depth)
	c.wcs = make([]cWC, 64)
	c.pfds = [2]unix.PollFd{{Fd: int32(c.cq.fd), Events: unix.POLLIN}, {Fd: int32(c.ctrlFd), Events: unix.POLLIN}}
	if c.qp, err = c.dev.createQP(c.pd, c.cq, depth, rand.Uint32(), false); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	} else {
		nc.SetDeadline(time.Now().Add(ctrlTimeout))
	}
	// ctx bounds the handshake: cancelling it fails the blocked I/O.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	m := msg{Type: msgHello, EP: c.dev.endpoint(c.qp, depth)}
	if err := writeMsg(nc, c.cbuf[:], &m); err != nil {
		return nil, fmt.Errorf("rdma: verbs: hello to %s: %w", addr, err)
	}
	rep, err := readMsg(nc, c.cbuf[:])
	if err != nil {
		return nil, fmt.Errorf("rdma: verbs: hello from %s: %w", addr, err)
	}
	if rep.Type != msgWelcome {
		return nil, fmt.Errorf("%w: verbs: %s answered HELLO with %s", rdma.ErrProtocol, addr, rep.Type)
	}
	nc.SetDeadline(time.Time{})
	if err := c.dev.connect(c.qp, rep.EP); err != nil {
		return nil, err
	}
	return c, nil
}

// openFor opens the device serving local address a.
func openFor(a net.Addr, cfg Config) (*device, error) {
	var ip net.IP
	if ta, ok := a.(*net.TCPAddr); ok {
		ip = ta.IP
	}
	devs, err := listDevices()
	if err != nil {
		return nil, err
	}
	sel, err := choose(devs, ip, cfg)
	if err != nil {
		return nil, err
	}
	return openDevice(sel)
}

// teardown releases everything; the QP goes before the CQ, MRs before the PD.
func (c *conn) teardown() {
	if c.qp != nil {
		c.qp.destroy()
		c.qp = nil
	}
	for i := range c.locals {
		c.locals[i].release()
	}
	c.locals = nil
	if c.arenaMR != nil {
		c.arenaMR.deregister()
		c.arenaMR = nil
	}
	if c.cq != nil {
		c.cq.destroy()
		c.cq = nil
	}
	if c.pd != nil {
		c.pd.free()
		c.pd = nil
	}
	if c.dev != nil {
		c.dev.close()
		c.dev = nil
	}
	if c.arena != nil {
		unix.Munmap(c.arena)
		c.arena, c.stage, c.atom = nil, nil, nil
	}
	if c.ctrl != nil {
		c.ctrl.Close()
	}
}

func (c *conn) slot(seq uint64) *slot { return &c.slots[seq%uint64(c.depth)] }

// Post implements rdma.Conn. It may block for a control round trip the
// first time a key is used, and while the bounce arena is full.
func (c *conn) Post(wrs []rdma.WorkRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return rdma.ErrClosed
	}
	if c.failed != nil {
		return c.failed
	}
	for i := range wrs {
		if err := wrs[i].Check(); err != nil {
			return err
		}
	}
	if c.tail-c.head+uint64(len(wrs)) > uint64(c.depth) {
		return rdma.ErrQueueFull
	}
	// Learn every key first, so that a failure posts nothing.
	for i := range wrs {
		rk, err := c.resolveLocked(wrs[i].Key, false)
		if err != nil {
			clear(c.rks[:i])
			return err
		}
		c.rks[i] = rk
	}
	for i := range wrs {
		s := c.slot(c.tail)
		*s = slot{wr: wrs[i]}
		s.rk, c.rks[i] = c.rks[i], nil
		if st := check(&wrs[i], s.rk); st != rdma.StatusOK {
			s.state, s.status = slotDone, st
		} else if !wrs[i].Op.IsAtomic() && len(wrs[i].Local) == 0 {
			s.state = slotDone // nothing to move
		} else {
			s.state = slotQueued
		}
		c.tail++
	}
	c.pumpLocked()
	return nil
}

// check is the server's per-op check, done here because a verbs error on
// the QP would break the connection: the key's rights, bounds and atomic
// alignment. rk is nil for a key the server does not know.
func check(wr *rdma.WorkRequest, rk *remoteKey) rdma.Status {
	switch {
	case rk == nil:
		return rdma.StatusUnknownKey
	case rk.status != rdma.StatusOK:
		return rk.status
	case !rk.access.Allows(wr.Op):
		return rdma.StatusPermission
	}
	n := uint64(wr.Len())
	if wr.Offset > rk.len || n > rk.len-wr.Offset {
		return rdma.StatusOutOfBounds
	}
	if wr.Op.IsAtomic() && (rk.addr+wr.Offset)%rdma.AtomicSize != 0 {
		return rdma.StatusMisaligned
	}
	return rdma.StatusOK
}

// resolveLocked returns what the server says of k, from the cache unless
// fresh. Unknown keys are not cached (nil).
func (c *conn) resolveLocked(k rdma.Key, fresh bool) (*remoteKey, error) {
	if k.IsZero() {
		return nil, nil
	}
	if rk := c.keys[k]; rk != nil && (!fresh || rk.status != rdma.StatusOK) {
		return rk, nil
	}
	m := msg{Type: msgResolve, Key: k}
	rep, err := c.roundTripLocked(&m, msgGrant)
	if err != nil {
		return nil, err
	}
	if rep.G.Key != k {
		return nil, c.failLocked(fmt.Errorf("%w: %w: verbs GRANT for another key", rdma.ErrTransport, rdma.ErrProtocol))
	}
	switch rep.G.Status {
	case rdma.StatusOK:
		rk := &remoteKey{status: rdma.StatusOK, access: rep.G.Access, rkey: rep.G.RKey, addr: rep.G.Addr, len: rep.G.Len}
		c.keys[k] = rk
		return rk, nil
	case rdma.StatusRevokedKey:
		// Not kept in the cache, which thus holds live keys only: a
		// revoked key costs a round trip per use.
		if rk := c.keys[k]; rk != nil {
			rk.status = rdma.StatusRevokedKey // slots hold the pointer
			delete(c.keys, k)
			return rk, nil
		}
		return revokedKey, nil
	default:
		if rk := c.keys[k]; rk != nil {
			rk.status = rdma.StatusRevokedKey
		}
		delete(c.keys, k)
		return nil, nil
	}
}

// roundTripLocked sends m and reads the answer, which must be of type want.
// A failure fails the connection.
func (c *conn) roundTripLocked(m *msg, want msgType) (msg, error) {
	c.ctrl.SetDeadline(time.Now().Add(ctrlTimeout))
	defer c.ctrl.SetDeadline(time.Time{})
	if err := writeMsg(c.ctrl, c.cbuf[:], m); err != nil {
		return msg{}, c.failLocked(fmt.Errorf("%w: verbs control %s: %w", rdma.ErrTransport, m.Type, err))
	}
	rep, err := readMsg(c.ctrl, c.cbuf[:])
	if err == nil && rep.Type != want {
		err = fmt.Errorf("%w: answer %s to %s", rdma.ErrProtocol, rep.Type, m.Type)
	}
	if err != nil {
		return msg{}, c.failLocked(fmt.Errorf("%w: verbs control %s: %w", rdma.ErrTransport, m.Type, err))
	}
	return rep, nil
}

// failLocked records a transport failure: every request not completed yet
// completes with StatusTransport, and the QP is flushed. It returns err.
func (c *conn) failLocked(err error) error {
	if c.failed != nil {
		return c.failed
	}
	c.failed = err
	if c.qp != nil {
		c.qp.setError()
	}
	for seq := c.head; seq < c.tail; seq++ {
		if s := c.slot(seq); s.state != slotDone {
			// The device may still write a bounce buffer of a posted
			// READ, but no buffer is reused after a failure.
			s.state, s.status, s.n = slotDone, rdma.StatusTransport, 0
		}
	}
	c.nposted = 0
	c.hwHead, c.nextPost = c.tail, c.tail
	c.freeStagingLocked()
	return err
}

// allocStage reserves n contiguous bytes of the bounce ring.
func (c *conn) allocStage(s *slot, n int) bool {
	size := uint64(len(c.stage))
	pos := c.aHead % size
	skip := uint64(0)
	if pos+uint64(n) > size {
		skip = size - pos
	}
	if c.aHead+skip+uint64(n)-c.aTail > size {
		return false
	}
	s.stageOff = (c.aHead + skip) % size
	c.aHead += skip + uint64(n)
	s.stageEnd, s.staged = c.aHead, true
	return true
}

// freeStagingLocked frees, in order, the bounce buffers of completed slots.
func (c *conn) freeStagingLocked() {
	for ; c.fseq < c.tail; c.fseq++ {
		s := c.slot(c.fseq)
		if s.state != slotDone {
			return
		}
		if s.staged {
			c.aTail, s.staged = s.stageEnd, false
		}
	}
}

// pumpLocked puts queued slots on the QP, in order. When the arena is
// full it reaps completions until there is room.
func (c *conn) pumpLocked() {
	n := 0
	flush := func() bool {
		if n == 0 {
			return true
		}
		c.wbuf[n-1].signaled = 1
		posted, err := c.qp.post(c.wbuf[:n])
		c.nposted += posted
		n = 0
		if err != nil {
			c.failLocked(fmt.Errorf("%w: %w", rdma.ErrTransport, err))
			return false
		}
		return true
	}
	for c.nextPost < c.tail && !c.broken && c.failed == nil {
		seq := c.nextPost
		s := c.slot(seq)
		if s.state != slotQueued {
			c.nextPost++
			continue
		}
		if s.rk.status != rdma.StatusOK { // revoked since Post
			s.state, s.status = slotDone, s.rk.status
			c.nextPost++
			continue
		}
		wr := &s.wr
		var laddr uint64
		var length uint32
		switch {
		case wr.Op.IsAtomic():
			idx := seq % uint64(c.depth)
			laddr, length = addrOf(c.atom[idx*8:]), rdma.AtomicSize
		case s.direct:
			laddr, length = addrOf(wr.Local), uint32(len(wr.Local))
		default:
			if lkey, ok := c.lookupLocal(wr.Local); ok {
				s.direct, s.lkey = true, lkey
				laddr, length = addrOf(wr.Local), uint32(len(wr.Local))
				break
			}
			if !s.staged {
				if !c.allocStage(s, len(wr.Local)) {
					if !flush() {
						return
					}
					c.waitRoomLocked()
					continue
				}
				if wr.Op == rdma.OpWrite {
					copy(c.stage[s.stageOff:], wr.Local)
				}
			}
			laddr, length = addrOf(c.stage[s.stageOff:]), uint32(len(wr.Local))
		}
		cmp, swp := wr.Compare, wr.Swap
		if wr.Op == rdma.OpFetchAdd {
			cmp = wr.Add
		}
		lkey := c.arenaMR.lkey
		if s.direct {
			lkey = s.lkey
		}
		setWR(&c.wbuf[n], seq, wr.Op, laddr, length, lkey, s.rk.addr+wr.Offset, s.rk.rkey, cmp, swp, false)
		n++
		s.state = slotPosted
		c.nextPost++
		if n == len(c.wbuf) && !flush() {
			return
		}
	}
	flush()
}

// waitRoomLocked reaps completions, waiting briefly for one, so that
// bounce buffers free up.
func (c *conn) waitRoomLocked() {
	if c.reapLocked() > 0 || c.nposted == 0 {
		return
	}
	c.cq.arm()
	if c.reapLocked() > 0 {
		return
	}
	unix.Poll(c.pfds[:1], 10)
	c.cq.drainEvents()
	c.reapLocked()
}

// reapLocked processes the completion queue; it returns the number of
// work completions seen.
func (c *conn) reapLocked() int {
	total := 0
	for c.failed == nil {
		got := c.cq.poll(c.wcs)
		for i := range got {
			c.completeLocked(&c.wcs[i])
		}
		total += got
		if got < len(c.wcs) {
			break
		}
	}
	c.freeStagingLocked()
	if c.broken && c.nposted == 0 && c.failed == nil {
		c.reconnectLocked()
	}
	return total
}

// completeLocked applies one work completion. A successful completion of
// a signalled request also completes the unsignalled ones before it (RC).
func (c *conn) completeLocked(wc *cWC) {
	seq := wcID(wc)
	if seq < c.hwHead || seq >= c.tail {
		return // already accounted for (after a failure)
	}
	st := wcStatus(wc)
	for ; c.hwHead <= seq; c.hwHead++ {
		s := c.slot(c.hwHead)
		if s.state != slotPosted {
			continue
		}
		if c.hwHead < seq && st != wcFlushErr || st == wcSuccess {
			// RC: requests before a completion have completed.
			c.finishLocked(s, c.hwHead)
			continue
		}
		if st == wcFlushErr {
			// Not executed: post it again on the next QP.
			c.nposted--
			s.state = slotQueued
			c.nextPost = min(c.nextPost, c.hwHead)
		}
	}
	s := c.slot(seq)
	if st == wcSuccess || st == wcFlushErr || s.state != slotPosted {
		return
	}
	c.nposted--
	switch st {
	case wcRemAccessErr:
		// The server deregistered the key's MR (revoked) since we
		// resolved it. Ask again; the QP is in error and must be
		// replaced.
		c.broken = true
		rk, err := c.resolveLocked(s.wr.Key, true)
		if err != nil {
			return
		}
		switch {
		case rk == nil:
			s.state, s.status = slotDone, rdma.StatusUnknownKey
		case rk.status != rdma.StatusOK:
			s.state, s.status = slotDone, rk.status
		default:
			c.failLocked(fmt.Errorf("%w: verbs: remote access error with a live key (vendor error %#x)", rdma.ErrTransport, wcVendorErr(wc)))
		}
	default:
		c.failLocked(fmt.Errorf("%w: verbs: %s (vendor error %#x)", rdma.ErrTransport, wcStatusString(st), wcVendorErr(wc)))
	}
}

// finishLocked completes a posted slot successfully.
func (c *conn) finishLocked(s *slot, seq uint64) {
	c.nposted--
	wr := &s.wr
	switch wr.Op {
	case rdma.OpRead:
		if !s.direct {
			copy(wr.Local, c.stage[s.stageOff:s.stageOff+uint64(len(wr.Local))])
		}
		s.n = uint32(len(wr.Local))
	case rdma.OpWrite:
		s.n = uint32(len(wr.Local))
	default:
		idx := seq % uint64(c.depth)
		s.value = binary.NativeEndian.Uint64(c.atom[idx*8:])
		if len(wr.Local) >= rdma.AtomicSize {
			binary.NativeEndian.PutUint64(wr.Local, s.value)
		}
		s.n = rdma.AtomicSize
	}
	s.state, s.status = slotDone, rdma.StatusOK
}

// reconnectLocked replaces the broken QP (both sides) and posts the
// flushed requests again.
func (c *conn) reconnectLocked() {
	c.qp.destroy()
	c.qp = nil
	qp, err := c.dev.createQP(c.pd, c.cq, c.depth, rand.Uint32(), false)
	if err != nil {
		c.failLocked(fmt.Errorf("%w: %w", rdma.ErrTransport, err))
		return
	}
	c.qp = qp
	m := msg{Type: msgReconnect, EP: c.dev.endpoint(qp, c.depth)}
	rep, err := c.roundTripLocked(&m, msgReconnected)
	if err != nil {
		return
	}
	if err := c.dev.connect(qp, rep.EP); err != nil {
		c.failLocked(fmt.Errorf("%w: %w", rdma.ErrTransport, err))
		return
	}
	c.broken = false
	c.hwHead = c.nextPost
	c.pumpLocked()
}

// pollLocked reaps the CQ and returns completed requests in order.
func (c *conn) pollLocked(cqes []rdma.Completion) int {
	if c.failed == nil {
		c.reapLocked()
		c.pumpLocked()
	}
	n := 0
	for n < len(cqes) && c.head < c.fseq {
		s := c.slot(c.head)
		cqes[n] = rdma.Completion{ID: s.wr.ID, Op: s.wr.Op, Status: s.status, Len: s.n, Value: s.value}
		if s.status != rdma.StatusOK {
			cqes[n].Len, cqes[n].Value = 0, 0
		}
		s.wr = rdma.WorkRequest{} // drop the caller's buffer
		s.rk = nil
		c.head++
		n++
	}
	return n
}

// Poll implements rdma.Conn.
func (c *conn) Poll(cqes []rdma.Completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, rdma.ErrClosed
	}
	return c.pollLocked(cqes), nil
}

// Wait implements rdma.Conn. It sleeps on the completion channel and on
// the control socket (whose end is a transport failure).
func (c *conn) Wait(ctx context.Context, cqes []rdma.Completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return 0, rdma.ErrClosed
		}
		if n := c.pollLocked(cqes); n > 0 || len(cqes) == 0 {
			return n, nil
		}
		if c.head == c.tail {
			if c.failed != nil {
				return 0, c.failed
			}
			return 0, rdma.ErrIdle
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := c.cq.arm(); err != nil {
			c.failLocked(fmt.Errorf("%w: %w", rdma.ErrTransport, err))
			continue
		}
		if n := c.pollLocked(cqes); n > 0 {
			return n, nil
		}
		ms := 50
		if dl, ok := ctx.Deadline(); ok {
			ms = min(ms, max(int(time.Until(dl)/time.Millisecond)+1, 0))
		}
		c.pfds[0].Revents, c.pfds[1].Revents = 0, 0
		c.mu.Unlock()
		_, perr := unix.Poll(c.pfds[:], ms)
		c.mu.Lock()
		if c.closed {
			return 0, rdma.ErrClosed
		}
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			c.failLocked(fmt.Errorf("%w: verbs: poll: %w", rdma.ErrTransport, perr))
			continue
		}
		c.cq.drainEvents()
		if c.pfds[1].Revents != 0 && c.failed == nil {
			c.checkCtrlLocked()
		}
	}
}

// checkCtrlLocked reads the control socket, readable while no request is
// pending: the server never speaks first, so this is its end.
func (c *conn) checkCtrlLocked() {
	c.ctrl.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.ctrl.Read(c.cbuf[:1])
	c.ctrl.SetReadDeadline(time.Time{})
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return // spurious
	}
	if err == nil {
		err = fmt.Errorf("%w: unsolicited control data", rdma.ErrProtocol)
	}
	c.failLocked(fmt.Errorf("%w: verbs: control connection: %w", rdma.ErrTransport, err))
}

// Close implements rdma.Conn: it destroys the QP (outstanding requests are
// abandoned) and closes the control connection. It is safe to call twice.
func (c *conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.teardown()
	return nil
}
