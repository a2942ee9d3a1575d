package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
	"rmem/rdma/internal/atomicmem"
	"rmem/rdma/internal/queue"
)

// mapTimeout bounds one MAP round trip (the first use of a key).
const mapTimeout = 10 * time.Second

var errServerClosed = errors.New("rdma/shm: server closed the connection")

// Dial connects to a shm Listener's socket path.
func Dial(ctx context.Context, path string, opts rdma.DialOptions) (rdma.Conn, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("rdma/shm: dial %s: %w: %w", path, rdma.ErrTransport, err)
	}
	uc := nc.(*net.UnixConn)
	ctl, err := handshake(ctx, uc)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("rdma/shm: dial %s: %w", path, err)
	}
	c := &conn{
		nc:      uc,
		q:       queue.New(opts.QueueDepth()),
		ctl:     ctl,
		keys:    map[rdma.Key]*mapping{},
		replies: make(chan ctlReply, 1),
		exited:  make(chan struct{}),
	}
	go c.routineReadControl()
	return c, nil
}

func handshake(ctx context.Context, uc *net.UnixConn) ([]byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [srvHelloSize + 1]byte
	putHello(b[:helloSize])
	if _, err := uc.Write(b[:helloSize]); err != nil {
		return nil, fmt.Errorf("%w: handshake: %w", rdma.ErrTransport, err)
	}
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, fmt.Errorf("%w: handshake: %w", rdma.ErrTransport, err)
	}
	fd, err := takeFd(oob[:oobn])
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	v, err := decodeHello(b[:n])
	if err != nil {
		return nil, err
	}
	if v != version {
		return nil, fmt.Errorf("%w: server speaks %d, we speak %d", rdma.ErrVersion, v, version)
	}
	if n != srvHelloSize || binary.LittleEndian.Uint32(b[8:]) != ctlSize {
		return nil, fmt.Errorf("%w: bad server hello", rdma.ErrProtocol)
	}
	ctl, err := unix.Mmap(fd, 0, ctlSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("rdma/shm: map control memory: %w", err)
	}
	if !stop() {
		unix.Munmap(ctl)
		return nil, ctx.Err()
	}
	uc.SetDeadline(time.Time{})
	return ctl, nil
}

// takeFd extracts exactly one file descriptor from a control message.
func takeFd(oob []byte) (int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1, fmt.Errorf("%w: control message: %w", rdma.ErrProtocol, err)
	}
	var fds []int
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, f...)
	}
	if len(fds) != 1 {
		for _, f := range fds {
			unix.Close(f)
		}
		return -1, fmt.Errorf("%w: got %d file descriptors, want 1", rdma.ErrProtocol, len(fds))
	}
	return fds[0], nil
}

// mapping is one key's range mapped into this process.
type mapping struct {
	mem    []byte // the key's range
	whole  []byte // the page-aligned mapping (for munmap)
	slot   int
	access rdma.Access
	state  []byte // the slot's state word in ctl
	busy   []byte // the slot's inflight word in ctl
}

type ctlReply struct {
	rep mapReply
	fd  int
	err error
}

// conn executes ops in the caller's goroutine, inside Post, on memory
// mapped from the server. The socket carries only MAP/UNMAP; one goroutine
// reads it, which also notices the server going away.
type conn struct {
	nc      *net.UnixConn
	q       *queue.Queue
	replies chan ctlReply
	exited  chan struct{}
	broken  atomic.Bool // the socket failed: no new ops

	mu   sync.Mutex // serializes Post and Close; guards the fields below
	ctl  []byte     // control memory (nil after Close)
	keys map[rdma.Key]*mapping

	closeOnce sync.Once
}

var _ rdma.Conn = (*conn)(nil)

// Post executes the requests before returning; their completions are then
// ready. The first request with a key not yet mapped costs a round trip to
// the server (MAP), bounded by mapTimeout.
func (c *conn) Post(wrs []rdma.WorkRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctl != nil && c.broken.Load() {
		c.breakLocked(errServerClosed)
	}
	if _, err := c.q.Enqueue(wrs); err != nil {
		return err
	}
	for i := range wrs {
		st, n, v := c.exec(&wrs[i])
		if st == rdma.StatusTransport {
			c.breakLocked(errServerClosed)
			// The rest of the batch completes with StatusTransport too.
			return nil
		}
		c.q.Complete(st, n, v)
	}
	return nil
}

// exec runs one request. Preconditions: c.mu must be locked.
func (c *conn) exec(wr *rdma.WorkRequest) (rdma.Status, uint32, uint64) {
	if c.ctl == nil {
		return rdma.StatusTransport, 0, 0
	}
	m, st := c.lookupLocked(wr.Key)
	if st != rdma.StatusOK {
		return st, 0, 0
	}
	if !m.access.Allows(wr.Op) {
		return rdma.StatusPermission, 0, 0
	}
	n := uint64(wr.Len())
	size := uint64(len(m.mem))
	if wr.Offset > size || n > size-wr.Offset {
		return rdma.StatusOutOfBounds, 0, 0
	}
	mem := m.mem[wr.Offset : wr.Offset+n]
	if wr.Op.IsAtomic() && !atomicmem.Aligned(mem) {
		return rdma.StatusMisaligned, 0, 0
	}
	// Enter: announce the op, then check the key and the connection
	// (Dekker with the server's fence, which stores the state and then
	// waits for inflight to be 0).
	atomicmem.Store32(m.busy, 1)
	if atomicmem.Load32(c.ctl[0:4]) != connLive {
		atomicmem.Store32(m.busy, 0)
		return rdma.StatusTransport, 0, 0
	}
	if atomicmem.Load32(m.state) != slotValid {
		atomicmem.Store32(m.busy, 0)
		c.dropLocked(wr.Key, m)
		return rdma.StatusRevokedKey, 0, 0
	}
	var v uint64
	switch wr.Op {
	case rdma.OpRead:
		copy(wr.Local, mem)
	case rdma.OpWrite:
		copy(mem, wr.Local)
	case rdma.OpCompareSwap:
		v = atomicmem.CompareAndSwap(mem, wr.Compare, wr.Swap)
	case rdma.OpFetchAdd:
		v = atomicmem.FetchAdd(mem, wr.Add)
	}
	atomicmem.Store32(m.busy, 0)
	return rdma.StatusOK, uint32(n), v
}

// lookupLocked returns k's mapping, mapping it on first use.
// Preconditions: c.mu must be locked.
func (c *conn) lookupLocked(k rdma.Key) (*mapping, rdma.Status) {
	if m, ok := c.keys[k]; ok {
		return m, rdma.StatusOK
	}
	if c.broken.Load() {
		return nil, rdma.StatusTransport
	}
	var b [reqSize]byte
	putRequest(b[:], request{Op: opMap, Key: k})
	if _, err := c.nc.Write(b[:]); err != nil {
		c.broken.Store(true)
		return nil, rdma.StatusTransport
	}
	t := time.NewTimer(mapTimeout)
	defer t.Stop()
	var r ctlReply
	select {
	case r = <-c.replies:
	case <-c.exited:
		return nil, rdma.StatusTransport
	case <-t.C:
		c.broken.Store(true)
		c.nc.Close()
		return nil, rdma.StatusTransport
	}
	if r.err != nil {
		return nil, rdma.StatusTransport
	}
	if r.rep.Status != rdma.StatusOK {
		return nil, r.rep.Status
	}
	defer unix.Close(r.fd)
	m, err := mapRange(r.fd, r.rep)
	if err != nil {
		// The server's memfd does not match what it described.
		c.broken.Store(true)
		c.nc.Close()
		return nil, rdma.StatusTransport
	}
	off := slotOff(int(r.rep.Slot))
	m.state = c.ctl[off : off+4]
	m.busy = c.ctl[off+4 : off+8]
	c.keys[k] = m
	return m, rdma.StatusOK
}

// mapRange maps [Offset, Offset+Length) of fd, page-aligned, with the
// protection the access allows.
func mapRange(fd int, r mapReply) (*mapping, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	// mmap offsets must be multiples of the file's page size: 4 KiB for
	// shmem, the huge page size for a MFD_HUGETLB memfd (its st_blksize).
	page := uint64(os.Getpagesize())
	if b := uint64(st.Blksize); b > page && b&(b-1) == 0 {
		page = b
	}
	start := r.Offset &^ (page - 1)
	end := r.Offset + r.Length
	if end < r.Offset {
		return nil, fmt.Errorf("%w: range wraps", rdma.ErrProtocol)
	}
	end = (end + page - 1) &^ (page - 1)
	if uint64(st.Size) < end {
		return nil, fmt.Errorf("%w: memfd of %d bytes, range ends at %d", rdma.ErrProtocol, st.Size, end)
	}
	prot := unix.PROT_READ
	if r.Access&rdma.AccessWrite != 0 {
		prot |= unix.PROT_WRITE
	}
	whole, err := unix.Mmap(fd, int64(start), int(end-start), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("rdma/shm: mmap key range: %w", err)
	}
	lo := r.Offset - start
	return &mapping{
		mem: whole[lo : lo+r.Length : lo+r.Length], whole: whole,
		slot: int(r.Slot), access: r.Access,
	}, nil
}

// dropLocked unmaps a revoked key and lets the server recycle its slot.
// Preconditions: c.mu must be locked.
func (c *conn) dropLocked(k rdma.Key, m *mapping) {
	delete(c.keys, k)
	unix.Munmap(m.whole)
	var b [reqSize]byte
	putRequest(b[:], request{Op: opUnmap, Slot: uint32(m.slot)})
	c.nc.Write(b[:]) // best effort: a lost UNMAP only leaks a slot until close
}

// breakLocked fails the connection: no new ops, mappings dropped.
// Preconditions: c.mu must be locked.
func (c *conn) breakLocked(cause error) {
	c.broken.Store(true)
	c.q.Fail(cause)
	c.unmapAllLocked()
}

func (c *conn) unmapAllLocked() {
	for k, m := range c.keys {
		unix.Munmap(m.whole)
		delete(c.keys, k)
	}
}

func (c *conn) Poll(cqes []rdma.Completion) (int, error) { return c.q.Poll(cqes) }

func (c *conn) Wait(ctx context.Context, cqes []rdma.Completion) (int, error) {
	if c.broken.Load() {
		c.mu.Lock()
		if c.ctl != nil {
			c.breakLocked(errServerClosed)
		}
		c.mu.Unlock()
	}
	return c.q.Wait(ctx, cqes)
}

// Close unmaps everything, then closes the socket (which tells the server
// this client can no longer touch its memory) and waits for the control
// reader. Safe to call twice.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.unmapAllLocked()
		if c.ctl != nil {
			unix.Munmap(c.ctl)
			c.ctl = nil
		}
		c.q.Close()
		c.mu.Unlock()
		c.nc.Close()
	})
	<-c.exited
	return nil
}

// routineReadControl reads MAP replies (and notices the socket closing).
func (c *conn) routineReadControl() {
	defer close(c.exited)
	var b [replySize + 1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, flags, _, err := c.nc.ReadMsgUnix(b[:], oob)
		if err != nil || n == 0 {
			c.broken.Store(true)
			return
		}
		r := ctlReply{fd: -1}
		r.rep, r.err = decodeMapReply(b[:n])
		if r.err == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			r.err = fmt.Errorf("%w: truncated reply", rdma.ErrProtocol)
		}
		if oobn > 0 {
			fd, err := takeFd(oob[:oobn])
			if err == nil && (r.err != nil || r.rep.Status != rdma.StatusOK) {
				unix.Close(fd) // unexpected fd
			} else if r.err == nil {
				r.fd, r.err = fd, err
			}
		} else if r.err == nil && r.rep.Status == rdma.StatusOK {
			r.err = fmt.Errorf("%w: map reply without a file descriptor", rdma.ErrProtocol)
		}
		select {
		case c.replies <- r:
		default:
			// A reply nobody asked for: the server is confused.
			if r.fd >= 0 {
				unix.Close(r.fd)
			}
			c.broken.Store(true)
			c.nc.Close()
			return
		}
		if r.err != nil {
			c.broken.Store(true)
			c.nc.Close()
			return
		}
	}
}
