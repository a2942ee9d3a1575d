package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
	"rmem/rdma/internal/atomicmem"
	"rmem/rdma/internal/connset"
)

// helloTimeout bounds the handshake of an accepted connection.
const helloTimeout = 10 * time.Second

// Listener serves a Domain's memfd-backed regions to clients on this host.
type Listener struct {
	ln    *net.UnixListener
	d     *rdma.Domain
	conns *connset.Set
}

// Listen serves d on the unix socket path (SOCK_SEQPACKET). A stale socket
// file at path is removed first. Only regions made by rdma.AllocRegion
// (with a memfd) can be mapped; keys of other regions get
// StatusPermission.
func Listen(path string, d *rdma.Domain, opts rdma.ListenOptions) (*Listener, error) {
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("rdma/shm: ListenOptions.MaxConns %d < 0", opts.MaxConns)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("rdma/shm: listen %s: %w", path, err)
	}
	l := &Listener{ln: ln, d: d}
	l.conns = connset.Serve(ln, opts.MaxConns, l.open)
	return l, nil
}

// Addr returns the socket path.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, marks every connection closed in its control
// memfd (clients' next ops fail with StatusTransport), closes them and
// waits for all of the listener's goroutines. Safe to call twice.
func (l *Listener) Close() error { return l.conns.Close() }

// Conns returns the number of connections being served.
func (l *Listener) Conns() int { return l.conns.Len() }

func (l *Listener) open(nc net.Conn) (connset.Conn, error) {
	return newServerConn(nc.(*net.UnixConn), l.d)
}

// Serve and Shutdown make a serverConn a connset.Conn.
func (c *serverConn) Serve()    { c.routineServe() }
func (c *serverConn) Shutdown() { c.shutdown() }

// serverConn is one client. routineServe owns the socket reads; Fence
// (from Domain.Revoke) and shutdown touch the control memory under mu.
type serverConn struct {
	nc      *net.UnixConn
	sess    *rdma.Session
	ctlFd   int
	ctl     []byte      // the control memfd, mapped shared
	pidfd   int         // the peer process, or -1
	gone    atomic.Bool // the client closed its end (or never completed the hello)
	closed  atomic.Bool // we closed the connection
	drained atomic.Bool // after close: the client was seen inside no op

	mu    sync.Mutex
	slots map[rdma.Key]int // guarded by mu: the slot of each mapped key
	used  [numSlots]bool   // guarded by mu
}

func newServerConn(nc *net.UnixConn, d *rdma.Domain) (*serverConn, error) {
	fd, err := unix.MemfdCreate("rmem-shm-ctl", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.Ftruncate(fd, ctlSize); err != nil {
		unix.Close(fd)
		return nil, err
	}
	ctl, err := unix.Mmap(fd, 0, ctlSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	c := &serverConn{nc: nc, ctlFd: fd, ctl: ctl, pidfd: -1, slots: map[rdma.Key]int{}}
	if pid := peerPid(nc); pid > 0 {
		if pfd, err := unix.PidfdOpen(pid, 0); err == nil {
			c.pidfd = pfd
		}
	}
	c.sess = d.NewSession(rdma.SessionHooks{Abort: c.shutdown, Fence: c.fence})
	return c, nil
}

func peerPid(nc *net.UnixConn) int {
	rc, err := nc.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	rc.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// shutdown tells the client the connection is closed and closes it.
func (c *serverConn) shutdown() {
	c.mu.Lock()
	if c.ctl != nil {
		atomicmem.Store32(c.ctl[0:4], connClosed)
	}
	c.mu.Unlock()
	c.closed.Store(true)
	c.nc.Close()
}

func (c *serverConn) routineServe() {
	defer c.cleanup()
	if err := c.handshake(); err != nil {
		return
	}
	var b [reqSize + 1]byte
	for {
		n, _, flags, _, err := c.nc.ReadMsgUnix(b[:], nil)
		if err != nil || n == 0 {
			if !c.closed.Load() {
				c.gone.Store(true) // the client closed its end
			}
			return
		}
		if flags&unix.MSG_TRUNC != 0 {
			return
		}
		req, err := decodeRequest(b[:n])
		if err != nil {
			return
		}
		switch req.Op {
		case opMap:
			if err := c.mapKey(req.Key); err != nil {
				return
			}
		case opUnmap:
			c.unmapSlot(int(req.Slot))
		}
	}
}

func (c *serverConn) handshake() error {
	c.nc.SetDeadline(time.Now().Add(helloTimeout))
	var b [helloSize + 1]byte
	n, _, _, _, err := c.nc.ReadMsgUnix(b[:], nil)
	if err != nil {
		return err
	}
	if n != helloSize {
		return fmt.Errorf("%w: hello of %d bytes", rdma.ErrProtocol, n)
	}
	v, err := decodeHello(b[:n])
	if err != nil {
		return err
	}
	var out [srvHelloSize]byte
	putHello(out[:])
	binary.LittleEndian.PutUint32(out[8:], ctlSize)
	if _, _, err := c.nc.WriteMsgUnix(out[:], unix.UnixRights(c.ctlFd), nil); err != nil {
		return err
	}
	if v != version {
		return fmt.Errorf("%w: client speaks %d", rdma.ErrVersion, v)
	}
	return c.nc.SetDeadline(time.Time{})
}

// mapKey answers a MAP request. The key is checked and its slot made valid
// under c.mu, so a concurrent Fence for the key finds the slot.
func (c *serverConn) mapKey(k rdma.Key) error {
	var b [replySize]byte
	c.mu.Lock()
	rep, fd := c.mapKeyLocked(k)
	c.mu.Unlock()
	putMapReply(b[:], rep)
	var oob []byte
	if rep.Status == rdma.StatusOK {
		oob = unix.UnixRights(fd)
	}
	_, _, err := c.nc.WriteMsgUnix(b[:], oob, nil)
	return err
}

// mapKeyLocked registers k's mapping and picks its slot.
// Preconditions: c.mu must be locked.
func (c *serverConn) mapKeyLocked(k rdma.Key) (mapReply, int) {
	if slot, ok := c.slots[k]; ok {
		// Mapped again (the client dropped its mapping): same slot.
		if atomicmem.Load32(c.ctl[slotOff(slot):]) != slotValid {
			return mapReply{Status: rdma.StatusRevokedKey}, -1
		}
	}
	m, st := c.sess.Map(k)
	if st != rdma.StatusOK {
		return mapReply{Status: st}, -1
	}
	slot, ok := c.slots[k]
	if !ok {
		slot = -1
		for i := range c.used {
			if !c.used[i] {
				slot = i
				break
			}
		}
		if slot < 0 {
			return mapReply{Status: rdma.StatusInvalid}, -1 // out of slots
		}
		c.used[slot] = true
		c.slots[k] = slot
		off := slotOff(slot)
		atomicmem.Store32(c.ctl[off+4:], 0)
		atomicmem.Store32(c.ctl[off:], slotValid)
	}
	return mapReply{Status: rdma.StatusOK, Access: m.Access, Slot: uint32(slot), Offset: m.Offset, Length: m.Len}, m.Fd
}

// unmapSlot frees a slot the client has unmapped after seeing it revoked.
func (c *serverConn) unmapSlot(slot int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	off := slotOff(slot)
	if !c.used[slot] || atomicmem.Load32(c.ctl[off:]) != slotRevoked {
		return // only revoked slots are recycled
	}
	for k, s := range c.slots {
		if s == slot {
			delete(c.slots, k)
		}
	}
	atomicmem.Store32(c.ctl[off:], slotFree)
	c.used[slot] = false
}

// fence is the Domain's Fence hook: revoke k's slot and wait until the
// client is not inside an op with it (Dekker handshake on the slot's
// state and inflight words), or the client is gone.
func (c *serverConn) fence(ctx context.Context, k rdma.Key) error {
	c.mu.Lock()
	slot, ok := c.slots[k]
	if !ok || c.ctl == nil {
		c.mu.Unlock()
		return nil
	}
	off := slotOff(slot)
	atomicmem.Store32(c.ctl[off:], slotRevoked)
	c.mu.Unlock()
	sleep := time.Microsecond
	for {
		c.mu.Lock()
		if c.ctl == nil {
			c.mu.Unlock()
			if c.drained.Load() {
				return nil
			}
			return fmt.Errorf("rdma/shm: connection closed while the client was inside an op")
		}
		busy := atomicmem.Load32(c.ctl[off+4:]) != 0
		c.mu.Unlock()
		if !busy || c.gone.Load() || c.peerExited() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("rdma/shm: client still inside an op: %w", err)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, time.Millisecond)
	}
}

func (c *serverConn) peerExited() bool {
	if c.pidfd < 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// drainTimeout bounds how long a server-side close waits for a client
// inside an op before unmapping the control memory.
const drainTimeout = time.Second

func (c *serverConn) cleanup() {
	c.sess.Close() // Revoke stops calling fence for this session
	c.nc.Close()
	c.mu.Lock()
	atomicmem.Store32(c.ctl[0:4], connClosed)
	c.mu.Unlock()
	// The client sees connClosed before any new op (Dekker, as for slots);
	// wait for ops already running, unless the client has gone.
	deadline := time.Now().Add(drainTimeout)
	for {
		if c.gone.Load() || c.peerExited() || c.idle() {
			c.drained.Store(true)
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Microsecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	unix.Munmap(c.ctl)
	c.ctl = nil
	unix.Close(c.ctlFd)
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
	}
}

// idle reports whether the client is inside no op.
func (c *serverConn) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for slot, used := range c.used {
		if used && atomicmem.Load32(c.ctl[slotOff(slot)+4:]) != 0 {
			return false
		}
	}
	return true
}
