package pager

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// pageSize is the only page size the pager handles (base pages).
const pageSize = 4096

const (
	maxMsgs     = 64   // uffd messages read per wake-up
	maxBatch    = 128  // READs per batch (faults + prefetches)
	maxHeld     = 4096 // faults waiting for an eviction or a retry
	retryPeriod = 5 * time.Millisecond
	maxThrottle = 50 * time.Millisecond
	probePeriod = time.Second
)

type pageRef struct {
	r   *region
	idx int
}

type readRef struct {
	pageRef
	prefetch bool
	sample   bool      // held back (sample.go)
	since    time.Time // when the fault that wants it began (zero: a prefetch)
}

type heldFault struct {
	pageRef
	flags userfaultfd.FaultFlags
	since time.Time
}

// client is one client process and the loop that serves it. Everything
// but the fields under mu and the counters is owned by the loop goroutine.
type client struct {
	a    *Agent
	id   uint64
	log  *zap.Logger
	uffd gatedUFFD
	io   PageIO
	st   counters

	mu  sync.Mutex
	ctl control // guarded by mu

	wakefd   int
	done     chan struct{}
	pidAtm   atomic.Int64
	uid      atomic.Uint32 // the client's user (SO_PEERCRED)
	localMem atomic.Uint64 // the budget its HELLO asked for (0: the agent's)

	// Loop state, by concern.
	sock     socketState // the process: its socket, pidfd and packets
	regs     regions
	clock    Clock
	fq       faultQueue // faults read, reads in flight, faults held
	room     roomState  // the pool's room and what was said about it
	fk       forkState
	ev       evictState // staging slots and the eviction in flight
	sample   samples
	features userfaultfd.Feature
	closed   bool

	cj *clientJournal // what a next agent needs to resume it (journal.go); nil: none
}

// control is what the agent's goroutines hand the loop (client.mu).
type control struct {
	pid     int
	pending *net.UnixConn // a connection handed over by the agent (forked child)
	stop    bool
}

// socketState is the client's connection: the socket, the process's
// pidfd, the packet buffers and the sequence of requests.
type socketState struct {
	conn    *net.UnixConn
	sockfd  int
	pidfd   int
	sendBuf []byte
	recvBuf []byte
	oob     []byte
	seq     uint32
	probed  time.Time // last liveness probe (gone)
}

// faultQueue is the fault path's state: uffd messages read, the reads of
// a batch and where they go, prefetches out, faults held for room or a
// page in flight, and messages read ahead.
type faultQueue struct {
	msgs        []userfaultfd.Msg
	pfds        []unix.PollFd
	reads       []PageOp
	readAt      []readRef
	merged      []PageOp // reads joined into runs (merge)
	mergedAt    []int    // first read of each merged op
	bufs        []byte
	pfOut       []int64
	held        []heldFault
	retry       []heldFault
	retrySpare  []heldFault
	early       []userfaultfd.Msg // messages read ahead by again
	earlySpare  []userfaultfd.Msg
	parked      []userfaultfd.Msg // a FORK event and what came after it, waiting for the eviction in flight (park)
	parkedSpare []userfaultfd.Msg
	zeros       []byte
}

// roomState is what the client knows of the pool's room: since when
// evictions found no slots, drains and trims it took part in, and what it
// has said about an unreachable pool (once each).
type roomState struct {
	noRoomSince time.Time // eviction found no pool slots for dirty pages
	noRoomRetry time.Time // and tries again from then on (or when room returns)
	reloc       relocation
	trimSeen    uint64    // the pool's last trim this client did
	stuckSaid   time.Time // a fault waited stuckWarn for an unreachable pool (said once)
	gaveUp      bool      // faults were given up (FaultTimeout): said once
	bentSaid    bool      // the budget bent for an unreachable pool: said once
}

// forkState follows the process's forks.
type forkState struct {
	forks    uint64
	forking  uint64    // serial of a FORK_PREPARE until its FORK_DONE: no evictions meanwhile
	forkedAt time.Time // when that FORK_PREPARE was answered (see forkStalled)
	// A fork waiting for the eviction in flight (park): since when, and
	// a FORK_PREPARE's request not answered yet.
	parkedSince time.Time
	preparing   bool
	prepareSeq  uint32
}

// evictState is the staging area and the eviction in flight.
type evictState struct {
	stagingFD  int
	staging    []byte
	stageFree  []uint32
	stageOwner []pageRef
	evict      proto.Evict
	evictRefs  [proto.MaxEvictBatch]pageRef
	newSlots   [proto.MaxEvictBatch]Slot // pool slots for an eviction's dirty victims
	evictBusy  bool
	evictSent  time.Time // when the EVICT in flight was sent
	evictSeq   uint64
	staged     int // pages in Staged state waiting for a write-back retry
	wb         []PageOp
	wbRef      []int
	victims    []Victim
}

// newClient prepares a client for uffd (owned from now on); the loop
// starts with run.
func (a *Agent) newClient(u faultFD, features userfaultfd.Feature) (*client, error) {
	return a.newClientWith(u, features, -1, a.opts.StagingSlots, 0)
}

// newClientWith is newClient with a staging memfd of slots pages (sfd, owned
// from now on; -1: a new one) and client id (0: a new one).
func (a *Agent) newClientWith(u faultFD, features userfaultfd.Feature, sfd, slots int, id uint64) (*client, error) {
	io, err := a.opts.Store.OpenIO()
	if err != nil {
		return nil, fmt.Errorf("pager: open page I/O: %w", err)
	}
	wfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		io.Close()
		if sfd >= 0 {
			unix.Close(sfd)
		}
		return nil, fmt.Errorf("pager: eventfd: %w", err)
	}
	if sfd < 0 {
		sfd, err = unix.MemfdCreate("rmem-staging", unix.MFD_CLOEXEC)
		if err == nil {
			err = unix.Ftruncate(sfd, int64(slots)*pageSize)
		}
	}
	var staging []byte
	if err == nil {
		staging, err = unix.Mmap(sfd, 0, slots*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err != nil {
		io.Close()
		unix.Close(wfd)
		if sfd > 0 {
			unix.Close(sfd)
		}
		return nil, fmt.Errorf("pager: staging memfd: %w", err)
	}
	if id == 0 {
		id = a.nextID.Add(1)
	}
	c := &client{
		a: a, id: id, uffd: gatedUFFD{faultFD: u}, io: io, features: features,
		wakefd: wfd, done: make(chan struct{}),
		sock: socketState{sockfd: -1, pidfd: -1,
			sendBuf: make([]byte, 0, proto.MaxPacket), recvBuf: make([]byte, proto.MaxPacket),
			oob: make([]byte, proto.OOBSize)},
		fq: faultQueue{
			msgs:  make([]userfaultfd.Msg, maxMsgs),
			pfds:  make([]unix.PollFd, 0, 4),
			reads: make([]PageOp, 0, maxBatch), readAt: make([]readRef, 0, maxBatch),
			merged: make([]PageOp, 0, maxBatch), mergedAt: make([]int, 0, maxBatch),
			bufs:  make([]byte, maxBatch*pageSize),
			pfOut: make([]int64, a.opts.MaxPrefetch),
			held:  make([]heldFault, 0, maxHeld), retry: make([]heldFault, 0, maxHeld),
			retrySpare: make([]heldFault, 0, maxHeld),
			early:      make([]userfaultfd.Msg, 0, maxMsgs), earlySpare: make([]userfaultfd.Msg, 0, maxMsgs),
			parked: make([]userfaultfd.Msg, 0, 2*maxMsgs), parkedSpare: make([]userfaultfd.Msg, 0, 2*maxMsgs),
			zeros: make([]byte, pageSize)},
		sample: samples{buf: make([]byte, sampleSlots*pageSize)},
		ev: evictState{stagingFD: sfd, staging: staging,
			stageFree: make([]uint32, 0, slots), stageOwner: make([]pageRef, slots),
			wb: make([]PageOp, 0, proto.MaxEvictBatch), wbRef: make([]int, 0, proto.MaxEvictBatch),
			victims: make([]Victim, proto.MaxEvictBatch)},
	}
	for s := slots - 1; s >= 0; s-- {
		c.ev.stageFree = append(c.ev.stageFree, uint32(s))
	}
	c.log = a.log.With(zap.Uint64("client", c.id))
	if lr, ok := io.(localRegistrar); ok {
		for _, mem := range [][]byte{c.fq.bufs, c.ev.staging} {
			if err := lr.RegisterLocal(mem); err != nil {
				c.log.Warn("registering page buffers for zero-copy transfers failed; pages go through the transport's bounce buffer", zap.Error(err))
			}
		}
	}
	return c, nil
}

// localRegistrar is a PageIO whose transport moves pages straight from
// registered buffers (verbs): the loop registers its read buffers and
// staging slots, which live until teardown closes the IO.
type localRegistrar interface {
	RegisterLocal(mem []byte) error
}

// attach hands the client its connection and pid (from the agent's
// goroutine) and wakes the loop.
func (c *client) attach(conn *net.UnixConn, pid int) {
	c.mu.Lock()
	c.ctl.pending, c.ctl.pid = conn, pid
	c.mu.Unlock()
	c.pidAtm.Store(int64(pid))
	c.wake()
}

// shutdown asks the loop to stop and waits for it.
func (c *client) shutdown() {
	c.mu.Lock()
	c.ctl.stop = true
	c.mu.Unlock()
	c.wake()
	<-c.done
}

func (c *client) wake() {
	var one = [8]byte{1}
	unix.Write(c.wakefd, one[:])
}

// RoutineServe is the client's loop: one goroutine on a locked OS thread
// that owns every piece of the client's state.
func (c *client) RoutineServe() {
	defer close(c.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.a.loopsAdd(1) // Options.LoopsChanged
	defer c.a.loopsAdd(-1)
	defer c.teardown()
	for {
		if c.control() {
			return
		}
		c.forkSettled()
		if len(c.fq.early) > 0 { // read ahead outside serveUFFD
			c.serveUFFD()
		}
		c.fq.pfds = c.fq.pfds[:0]
		if !c.parked() { // messages after a parked FORK wait in the kernel
			c.fq.pfds = append(c.fq.pfds, unix.PollFd{Fd: int32(c.uffd.Fd()), Events: unix.POLLIN})
		}
		c.fq.pfds = append(c.fq.pfds, unix.PollFd{Fd: int32(c.wakefd), Events: unix.POLLIN})
		if c.sock.sockfd >= 0 {
			c.fq.pfds = append(c.fq.pfds, unix.PollFd{Fd: int32(c.sock.sockfd), Events: unix.POLLIN})
		}
		if c.sock.pidfd >= 0 {
			c.fq.pfds = append(c.fq.pfds, unix.PollFd{Fd: int32(c.sock.pidfd), Events: unix.POLLIN})
		}
		timeout := -1
		if c.sock.pidfd < 0 && len(c.regs.list) > 0 {
			timeout = int(probePeriod / time.Millisecond) // see gone
		}
		if len(c.fq.retry) > 0 || c.ev.staged > 0 || c.room.reloc.pending(c) || c.parked() || c.fk.preparing {
			timeout = int(retryPeriod / time.Millisecond)
		}
		_, err := unix.Poll(c.fq.pfds, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			c.log.Error("poll failed; dropping client", zap.Error(err))
			return
		}
		for _, p := range c.fq.pfds {
			switch {
			case p.Revents == 0:
			case int(p.Fd) == c.wakefd:
				var b [8]byte
				unix.Read(c.wakefd, b[:])
				if !c.room.noRoomRetry.IsZero() && c.a.slots.hasFree() {
					c.room.noRoomRetry = time.Time{} // onRoom: evict now, not at the pause's end
				}
			case int(p.Fd) == c.uffd.Fd():
				if p.Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
					c.log.Info("uffd hung up: client gone")
					return
				}
				c.serveUFFD()
			case int(p.Fd) == c.sock.sockfd:
				// Handling the uffd may have dropped the connection:
				// a stale POLLIN must not block the loop in a read.
				if c.sock.sockfd < 0 || !readable(c.sock.sockfd) {
					continue
				}
				// Messages read ahead come first: a client that asked
				// for REMOVE events (the shim and the Go client do not)
				// raised its madvise's before it sent EVICTED, and they
				// must be handled while the batch's pages are busy.
				if len(c.fq.early) > 0 {
					c.serveUFFD()
				}
				if !c.serveSocket() {
					c.log.Info("client closed its connection")
					return
				}
			case int(p.Fd) == c.sock.pidfd:
				c.log.Info("client exited", zap.Int("pid", int(c.pidAtm.Load())))
				return
			}
		}
		if c.parked() {
			continue // nothing moves until the fork is handled
		}
		c.relocate()
		c.trim()
		c.maybeEvict()
		c.retryHeld()
		c.retryWriteBack()
		c.maybeEvict()
		if c.sock.pidfd < 0 && c.gone() {
			c.log.Info("client without HELLO exited")
			return
		}
	}
}

// gone reports whether the served process has exited, for a client with
// no pidfd (a child forked past fork(3) never says HELLO, DESIGN of
// docs/pager.md): write-protecting a page of its address space fails
// with ESRCH once the mm is gone. It is harmless otherwise: a clean
// resident page is protected already, a dirty one takes one more WP
// fault, a page not mapped is not touched.
func (c *client) gone() bool {
	if len(c.regs.list) == 0 {
		return false
	}
	now := time.Now()
	if now.Sub(c.sock.probed) < probePeriod {
		return false
	}
	c.sock.probed = now
	err := c.uffd.WriteProtect(pageRange(c.regs.list[0].start))
	return errors.Is(err, unix.ESRCH)
}

// throttle reports whether a fault that adds a resident page must wait:
// the client is a batch past its budget (budgetMargin). While an eviction
// is in flight the fault waits for it, until it has been in flight for
// maxThrottle: then the budget bends rather than stall a client whose
// helper cannot run (a Go client whose every P is held by a thread
// blocked in a fault). Otherwise no
// eviction could start (the pool has no room for dirty pages and no clean
// one is left, or every staging slot holds a page whose write-back
// failed): the fault waits until one can, however long (back-pressure:
// the budget holds and nothing is lost; docs/pager.md, Budget).
func (c *client) throttle(since time.Time) bool {
	if c.sock.conn == nil || c.forkStalled() {
		return false // nothing evicts this client now
	}
	if int(c.st.resident.Load())+len(c.fq.reads) < c.budgetPages()+budgetMargin {
		return false
	}
	if c.ev.evictBusy {
		// Measured from the EVICT, not from the fault: a fault that
		// waited for room (pool full) must not pass the budget the
		// moment room returns and an eviction starts.
		return time.Since(c.ev.evictSent) < maxThrottle
	}
	if to := c.a.opts.FaultTimeout; to > 0 && time.Since(since) >= to && !c.a.slots.full() {
		// Not a full pool but an unreachable one (write-backs fail, or
		// the coordinator does not answer): the program must not hang,
		// so the budget bends (no page is lost: the evicted ones wait
		// in their staging slots).
		if !c.room.bentSaid {
			c.room.bentSaid = true
			c.log.Warn("the pool does not answer: the program goes over its budget rather than wait any longer",
				zap.Int("pid", int(c.pidAtm.Load())), zap.Duration("fault_timeout", to))
		}
		return false
	}
	c.st.waits.Add(1)
	return true
}

// budgetMargin is how far past its budget, in pages, a client's resident
// pages may go before its faults wait: one eviction batch (and the READs
// of one fault batch in flight, counted with them).
const budgetMargin = proto.MaxEvictBatch

// BudgetMargin is budgetMargin in bytes: a client's resident paged memory
// stays under its budget plus this (docs/pager.md, Budget).
const BudgetMargin = budgetMargin * pageSize

// budgetPages is the client's budget of resident pages.
func (c *client) budgetPages() int { return c.a.budgetPages(c.localMem.Load()) }

// control applies what the agent asked for; it reports whether to stop.
func (c *client) control() bool {
	c.mu.Lock()
	stop, conn, pid := c.ctl.stop, c.ctl.pending, c.ctl.pid
	c.ctl.pending = nil
	c.mu.Unlock()
	if stop {
		return true
	}
	if conn != nil {
		c.setConn(conn, pid)
		c.startJournal(pid, c.uid.Load()) // now that the pid is known (a forked child's)
	}
	return false
}

func (c *client) setConn(conn *net.UnixConn, pid int) {
	if c.sock.conn != nil {
		c.sock.conn.Close()
	}
	c.sock.conn, c.sock.sockfd = conn, -1
	if rc, err := conn.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { c.sock.sockfd = int(fd) })
	}
	if c.sock.pidfd < 0 && pid > 0 {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			c.log.Warn("pidfd_open failed: exit is seen only through the socket", zap.Int("pid", pid), zap.Error(err))
		} else {
			c.sock.pidfd = fd
		}
	}
}

// teardown frees everything the client holds. The client's evicted pages
// go back to the pool only if the process is gone (pidfd fired or the
// uffd hung up): on agent shutdown they stay, and the client, which holds
// its own reference to the uffd, blocks on its next fault instead of
// reading zeros.
func (c *client) teardown() {
	c.mu.Lock()
	agentStop := c.ctl.stop
	c.mu.Unlock()
	if !agentStop {
		c.a.freeRegions(c.regs.list)
		c.cj.remove()
	} else {
		c.cj.detach(c.regs.list) // for the agent after this one
	}
	c.io.Close()
	c.uffd.Close()
	if c.sock.conn != nil {
		c.sock.conn.Close()
	}
	c.mu.Lock()
	if c.ctl.pending != nil {
		c.ctl.pending.Close()
		c.ctl.pending = nil
	}
	c.mu.Unlock()
	if c.sock.pidfd >= 0 {
		unix.Close(c.sock.pidfd)
	}
	unix.Munmap(c.ev.staging)
	unix.Close(c.ev.stagingFD)
	unix.Close(c.wakefd)
	c.closed = true
	c.a.dropClient(c)
}

// freeRegions gives back the pool slots of regions: a client's that went
// away, or a fork copy no client adopted. A slot another region still
// names (shared across a fork) stays.
func (a *Agent) freeRegions(regs []*region) {
	for _, r := range regs {
		a.slots.release(r.slots...)
		clear(r.slots)
	}
}

// setSlot gives page idx of r the pool slot s (0: none) and releases the
// one it had, keeping the client's count of slots.
func (c *client) setSlot(r *region, idx int, s Slot) {
	old := r.slots[idx]
	if old == s {
		return
	}
	switch {
	case old == 0:
		c.st.pooled.Add(1)
	case s == 0:
		c.st.pooled.Add(-1)
	}
	r.slots[idx] = s
	if old != 0 {
		c.a.slots.release(old)
	}
}

// dirty marks resident page idx of r written: its pool copy, if any, is
// stale, and its slot is released (the other side of a fork that shares
// it keeps its reference).
func (c *client) dirty(r *region, idx int, p Page) {
	c.set(r, idx, p|FlagDirty)
	c.setSlot(r, idx, 0)
}

// set changes a page's entry, keeping the resident and remote counts.
func (c *client) set(r *region, idx int, np Page) {
	op := r.pages[idx]
	if op.State() != np.State() {
		c.count(op.State(), -1)
		c.count(np.State(), +1)
	}
	r.pages[idx] = np
}

func (c *client) count(s PageState, d int64) {
	switch s {
	case Resident:
		c.st.resident.Add(d)
	case Remote, Staged:
		c.st.remote.Add(d)
	}
}

func pageRange(a userfaultfd.Addr) userfaultfd.Range {
	return userfaultfd.Range{Start: a, Len: pageSize}
}

// serveUFFD reads and handles pending uffd messages in batches, until
// none is left or a FORK is parked.
func (c *client) serveUFFD() {
	for !c.parked() {
		if len(c.fq.early) > 0 {
			batch := c.fq.early
			c.fq.early, c.fq.earlySpare = c.fq.earlySpare[:0], batch
			c.handleMsgs(batch)
			continue
		}
		n, err := c.uffd.ReadEvents(c.fq.msgs)
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) {
				c.log.Error("reading uffd failed", zap.Error(err))
			}
			return
		}
		c.handleMsgs(c.fq.msgs[:n])
		if n < len(c.fq.msgs) && len(c.fq.early) == 0 {
			return
		}
	}
}

// handleMsgs handles a batch of uffd messages.
func (c *client) handleMsgs(msgs []userfaultfd.Msg) {
	now := time.Now()
	for i := range msgs {
		ev, err := msgs[i].Decode()
		if err != nil {
			c.log.Error("bad uffd message", zap.Error(err))
			continue
		}
		switch ev.Kind {
		case userfaultfd.EventPagefault:
			if ev.Flags&userfaultfd.FaultWP == 0 {
				c.st.faults.Add(1)
			} else {
				c.st.wpFaults.Add(1)
			}
			c.fault(ev.Addr.RoundDown(pageSize), ev.Flags, now)
		case userfaultfd.EventFork:
			// Before the batch's READs are installed: the child's page
			// tables were copied when the event was raised, without the
			// pages still in flight, so its copy of ours must say they
			// are in the pool (installing first would say resident).
			if c.mustPark() {
				c.park(msgs[i:]) // the READs are not installed (errForkAhead)
				c.flushReads(now)
				return
			}
			c.event(ev)
		default:
			c.flushReads(now)
			c.event(ev)
		}
	}
	c.flushReads(now)
}

// errForkAhead: a FORK event was read ahead of its turn (again) and is not
// handled yet. Reading it ended the kernel's refusal (EAGAIN) of ioctls
// that install pages, but a page installed now would be the parent's
// alone (the child's page tables are copied already) while the child's
// copy of our page table, made when the event is handled, would say it is
// mapped: the child would read zeros there. So nothing is installed until
// then, as if the kernel still refused.
var errForkAhead = fmt.Errorf("pager: a FORK event read ahead is not handled yet: %w", unix.EAGAIN)

// gatedUFFD is a client's uffd whose ioctls that install pages (Copy,
// ZeroPage, Poison) fail with errForkAhead while forkAhead is set: the
// one place that keeps the rule of errForkAhead.
type gatedUFFD struct {
	faultFD
	forkAhead bool // a FORK event read ahead is not handled yet
}

func (g *gatedUFFD) Copy(dst userfaultfd.Addr, src []byte, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead {
		return 0, errForkAhead
	}
	return g.faultFD.Copy(dst, src, flags)
}

func (g *gatedUFFD) ZeroPage(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead {
		return 0, errForkAhead
	}
	return g.faultFD.ZeroPage(r, flags)
}

func (g *gatedUFFD) Poison(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead {
		return 0, errForkAhead
	}
	return g.faultFD.Poison(r, flags)
}

// again reports whether an ioctl refused with EAGAIN is worth retrying at
// once. The kernel refuses while a REMOVE/UNMAP event of the client (its
// helper's madvise, a munmap) is unread: reading the pending messages now
// (handled later, in order, by serveUFFD) lifts that, so the page just
// fetched is installed instead of being fetched again on a later retry.
func (c *client) again(err error) bool {
	if !userfaultfd.IsMMChanged(err) || c.uffd.forkAhead || len(c.fq.early) == cap(c.fq.early) {
		return false
	}
	n, rerr := c.uffd.ReadEvents(c.fq.early[len(c.fq.early):cap(c.fq.early)])
	if rerr != nil || n == 0 {
		return false
	}
	for i := len(c.fq.early); i < len(c.fq.early)+n; i++ {
		if c.fq.early[:cap(c.fq.early)][i].Kind() == userfaultfd.EventFork {
			c.uffd.forkAhead = true // see errForkAhead
		}
	}
	c.fq.early = c.fq.early[:len(c.fq.early)+n]
	return !c.uffd.forkAhead
}

// fault handles one page fault at page address a.
func (c *client) fault(a userfaultfd.Addr, flags userfaultfd.FaultFlags, since time.Time) {
	r, idx := c.regs.find(a)
	if r == nil {
		// Not a region we know: nothing of it was ever evicted, so this
		// is a first touch.
		if _, err := c.zeroFill(a, since); err != nil {
			c.uffd.Wake(pageRange(a)) // it faults again
		}
		return
	}
	p := r.pages[idx]
	if p.Has(FlagBusy) {
		c.hold(&c.fq.held, heldFault{pageRef{r, idx}, flags, since})
		return
	}
	if flags&userfaultfd.FaultWP != 0 {
		if p.State() == Resident {
			c.dirty(r, idx, p|FlagRef)
			err := c.uffd.Unprotect(pageRange(a), 0)
			if c.again(err) {
				err = c.uffd.Unprotect(pageRange(a), 0)
			}
			if err != nil && !userfaultfd.IsGone(err) {
				if userfaultfd.IsMMChanged(err) {
					c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
					return
				}
				c.log.Error("unprotect failed", zap.Stringer("addr", a), zap.Error(err))
				c.uffd.Wake(pageRange(a))
			}
			c.st.latency.Observe(time.Since(since))
			return
		}
		// A write to a page we do not hold mapped: most often it is
		// not mapped any more (evicted since the fault was raised) and
		// faults again as MISSING once woken. Unprotecting instead of
		// only waking also lets a write through to a page that is mapped
		// after all (a REGION_ZAP whose madvise then failed) instead of
		// faulting forever; it is a no-op on an unmapped page.
		if err := c.uffd.Unprotect(pageRange(a), 0); err != nil {
			c.uffd.Wake(pageRange(a))
		}
		return
	}
	if st := p.State(); (st == Absent || st == Remote || st == Staged) && c.throttle(since) {
		c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		return
	}
	switch p.State() {
	case Absent:
		// Dirty: a write to the zero page is not seen (no WP on it).
		switch _, err := c.zeroFill(a, since); {
		case err == nil:
			c.set(r, idx, p.With(Resident)|FlagDirty|FlagRef)
		case userfaultfd.IsMMChanged(err):
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		}
	case Resident:
		// A repeated fault (EEXIST: woken), or the page was dropped
		// behind our back (a raw madvise(MADV_DONTNEED) system call, see
		// docs/pager.md): it reads as zeros now.
		switch mapped, err := c.zeroFill(a, since); {
		case mapped:
			c.dirty(r, idx, p|FlagRef)
		case userfaultfd.IsMMChanged(err):
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		}
	case Remote:
		if p.Has(FlagFetch) {
			c.demand(r, idx, since) // in this batch already: its install wakes the thread
			return
		}
		if p.Has(FlagSampled) && c.sampleHit(r, idx, flags, since) {
			return
		}
		c.addRead(r, idx, false)
		c.fq.readAt[len(c.fq.readAt)-1].since = since
		c.prefetch(r, idx)
	case Staged:
		if err := c.fromStage(r, idx, 0); userfaultfd.IsMMChanged(err) {
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
			return
		}
		c.st.latency.Observe(time.Since(since))
	case Lost:
		if err := c.poison(r, idx); userfaultfd.IsMMChanged(err) {
			c.hold(&c.fq.retry, heldFault{pageRef{r, idx}, flags, since})
		}
	}
}

// prefetch tells r's prefetcher of a fault on page idx and queues the
// READs it asks for.
func (c *client) prefetch(r *region, idx int) {
	if r.pf == nil {
		return
	}
	n := r.pf.Fault(int64(idx), int64(len(r.pages)), c.fq.pfOut)
	// Prefetching stops at the budget's margin, as faults do (throttle).
	room := c.budgetPages() + budgetMargin - int(c.st.resident.Load()) - len(c.fq.reads)
	for _, q := range c.fq.pfOut[:n] {
		qp := r.pages[q]
		if room <= 0 {
			break
		}
		if qp.State() == Remote && qp&(FlagFetch|FlagBusy|FlagSampled) == 0 {
			room--
			c.addRead(r, int(q), true)
			c.st.prefetchIssued.Add(1)
		}
	}
}

// zeroFill maps the zero page at a. It returns err nil when the page is
// mapped, with mapped true if this call mapped it (false: it was mapped
// before, EEXIST, and the thread is woken), else the error (IsMMChanged:
// retry after reading events; IsGone: nothing to do).
func (c *client) zeroFill(a userfaultfd.Addr, since time.Time) (mapped bool, err error) {
	_, err = c.uffd.ZeroPage(pageRange(a), 0)
	if c.again(err) {
		_, err = c.uffd.ZeroPage(pageRange(a), 0)
	}
	switch {
	case err == nil:
		mapped = true
		c.st.zeroFills.Add(1)
	case userfaultfd.IsExist(err):
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsMMChanged(err), userfaultfd.IsGone(err):
		return false, err
	default:
		c.log.Error("zeropage failed", zap.Stringer("addr", a), zap.Error(err))
		return false, err
	}
	c.st.latency.Observe(time.Since(since))
	return mapped, nil
}

func (c *client) hold(list *[]heldFault, h heldFault) {
	// A fault can come again while it is held (a signal interrupted the
	// thread's wait, and it faulted anew: the Go runtime preempts every
	// 10 ms): one entry per page, as old as the first fault, so that a
	// wait is bounded from when it began (FaultTimeout).
	for i := range *list {
		if e := &(*list)[i]; e.pageRef == h.pageRef {
			if h.since.Before(e.since) {
				e.since = h.since
			}
			e.flags |= h.flags
			return
		}
	}
	if list == &c.fq.held {
		c.st.held.Add(1)
	}
	if len(*list) == cap(*list) {
		// Full: let the thread fault again later.
		c.uffd.Wake(pageRange(h.r.addr(h.idx)))
		return
	}
	*list = append(*list, h)
}

// addRead queues a READ of page idx of r into the batch.
func (c *client) addRead(r *region, idx int, prefetch bool) {
	if len(c.fq.reads) == cap(c.fq.reads) {
		c.flushReads(time.Now())
	}
	k := len(c.fq.reads)
	slab, off := c.a.slots.where(r.slots[idx])
	c.fq.reads = append(c.fq.reads, PageOp{Slab: slab, Off: off, Buf: c.fq.bufs[k*pageSize : (k+1)*pageSize]})
	c.fq.readAt = append(c.fq.readAt, readRef{pageRef: pageRef{r, idx}, prefetch: prefetch})
	r.pages[idx] |= FlagFetch
}

// demand marks the READ of page idx of r in this batch as wanted by a
// fault, not only prefetched: if it cannot be installed, the fault is held
// for a retry rather than left waiting for a wake-up that never comes.
func (c *client) demand(r *region, idx int, since time.Time) {
	for k := range c.fq.readAt {
		if c.fq.readAt[k].r == r && c.fq.readAt[k].idx == idx {
			c.fq.readAt[k].prefetch = false
			if c.fq.readAt[k].since.IsZero() || since.Before(c.fq.readAt[k].since) {
				c.fq.readAt[k].since = since
			}
			return
		}
	}
}

// flushReads posts the batch of READs and installs what arrived.
func (c *client) flushReads(since time.Time) {
	if len(c.fq.reads) == 0 {
		return
	}
	c.merge()
	c.io.Read(c.a.ctx, c.fq.merged)
	for m, op := range c.fq.merged {
		end := len(c.fq.reads)
		if m+1 < len(c.fq.mergedAt) {
			end = c.fq.mergedAt[m+1]
		}
		for k := c.fq.mergedAt[m]; k < end; k++ {
			c.fq.reads[k].Err = op.Err
		}
	}
	// The sample, when one is due, is the batch's last prefetched page:
	// a stream's next fault comes past it anyway, and its hit (sampleHit)
	// prefetches on as that fault would.
	last, due := -1, false
	for k := range c.fq.reads {
		if c.fq.reads[k].Err == nil && c.fq.readAt[k].prefetch {
			last = k
			due = c.sample.sampleNow() || due
		}
	}
	if due {
		c.fq.readAt[last].sample = true
	}
	for k := 0; k < len(c.fq.reads); {
		if c.fq.readAt[k].sample {
			c.holdSample(k)
			k++
			continue
		}
		// A run of pages that arrived and are adjacent in the client is
		// installed with one UFFDIO_COPY (their buffers are adjacent too):
		// the ioctl costs ~5.5 µs for one page, ~1.5 µs a page for 64.
		j := k + 1
		for j < len(c.fq.reads) && c.fq.reads[k].Err == nil && c.fq.reads[j].Err == nil && !c.fq.readAt[j].sample &&
			c.fq.readAt[j].r == c.fq.readAt[k].r && c.fq.readAt[j].idx == c.fq.readAt[j-1].idx+1 {
			j++
		}
		if j-k > 1 {
			k += c.copyRun(k, j, since)
		}
		for ; k < j; k++ {
			c.installRead(k, since)
		}
	}
	c.fq.reads = c.fq.reads[:0]
	c.fq.readAt = c.fq.readAt[:0]
}

// merge joins the batch's reads into c.fq.merged: a run of reads of adjacent
// pages of one region whose slots are adjacent in one slab (an eviction
// batch takes consecutive slots for the sorted victims, so a run evicted
// together is one run in the pool; their buffers are adjacent too) is one
// READ, so that a prefetched stream moves in a few large transfers rather
// than many 4 KiB ones (measured on the sequential benchmark: a 32-page
// batch took ~150 µs as 32 READs).
func (c *client) merge() {
	c.fq.merged, c.fq.mergedAt = c.fq.merged[:0], c.fq.mergedAt[:0]
	for k := 0; k < len(c.fq.reads); {
		j := k + 1
		for j < len(c.fq.reads) && c.fq.readAt[j].r == c.fq.readAt[k].r && c.fq.readAt[j].idx == c.fq.readAt[j-1].idx+1 &&
			c.fq.reads[j].Slab == c.fq.reads[k].Slab && c.fq.reads[j].Off == c.fq.reads[j-1].Off+pageSize {
			j++
		}
		c.fq.merged = append(c.fq.merged, PageOp{Slab: c.fq.reads[k].Slab, Off: c.fq.reads[k].Off, Buf: c.fq.bufs[k*pageSize : j*pageSize]})
		c.fq.mergedAt = append(c.fq.mergedAt, k)
		k = j
	}
}

// copyRun installs reads [k, j), adjacent pages of one region, with one
// Copy, and returns how many it installed: all, or the pages before the
// one where the Copy stopped (the caller installs the rest one by one).
func (c *client) copyRun(k, j int, since time.Time) int {
	first := c.fq.readAt[k]
	n, err := c.uffd.Copy(first.r.addr(first.idx), c.fq.bufs[k*pageSize:j*pageSize], userfaultfd.WriteProtected)
	done := j - k
	if err != nil {
		done = min(max(n, 0)/pageSize, j-k)
	}
	for m := k; m < k+done; m++ {
		ref := c.fq.readAt[m]
		p := ref.r.pages[ref.idx] &^ FlagFetch
		c.st.remoteReads.Add(1)
		c.set(ref.r, ref.idx, p.With(Resident)|FlagRef)
		if !ref.prefetch {
			c.st.latency.Observe(time.Since(since))
		}
	}
	return done
}

// installRead installs read k of the batch, or poisons or retries it.
func (c *client) installRead(k int, since time.Time) {
	op := &c.fq.reads[k]
	ref := c.fq.readAt[k]
	if !ref.since.IsZero() {
		since = ref.since // a retried fault: its wait began then
	}
	r, idx := ref.r, ref.idx
	p := r.pages[idx] &^ FlagFetch
	r.pages[idx] = p
	switch {
	case op.Err == nil:
		c.st.remoteReads.Add(1)
		if err := c.install(r, idx, p, op.Buf); err != nil && !ref.prefetch {
			c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
		}
		if !ref.prefetch {
			c.st.latency.Observe(time.Since(since))
		}
	case errors.Is(op.Err, ErrLost):
		c.set(r, idx, p.With(Lost))
		c.setSlot(r, idx, 0) // its data is gone
		if err := c.poison(r, idx); err != nil && !ref.prefetch {
			c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
		}
	default:
		if ref.prefetch {
			return
		}
		if c.unreachableTooLong(since, op.Err) {
			// No replica answered for FaultTimeout: the program gets
			// SIGBUS, never zeros (its page may still exist somewhere,
			// but it cannot wait forever).
			c.set(r, idx, p.With(Lost))
			c.setSlot(r, idx, 0)
			if err := c.poison(r, idx); err != nil {
				c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
			}
			return
		}
		c.st.retries.Add(1)
		c.hold(&c.fq.retry, heldFault{ref.pageRef, 0, since})
	}
}

// unreachableTooLong reports whether a fault waiting since since for a
// page no replica of which answers (err) has waited FaultTimeout: then it
// is given up. It says so once per client when a fault first waits 5 s,
// and when it gives up.
func (c *client) unreachableTooLong(since time.Time, err error) bool {
	waited := time.Since(since)
	limit := c.a.opts.FaultTimeout
	if waited >= stuckWarn && c.room.stuckSaid.IsZero() {
		c.room.stuckSaid = time.Now()
		c.log.Warn("a fault waits for the pool: no replica of its page answers; the program gets SIGBUS if none does in time",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Duration("waited", waited.Round(time.Millisecond)),
			zap.Duration("fault_timeout", limit), zap.Error(err))
	}
	if limit <= 0 || waited < limit {
		return false
	}
	if !c.room.gaveUp {
		c.room.gaveUp = true
		c.log.Error("PAGES LOST TO THE PROGRAM: no replica answered within the fault timeout; its faults on them get SIGBUS",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Duration("fault_timeout", limit), zap.Error(err))
	}
	return true
}

// stuckWarn is how long a fault waits for an unreachable pool before the
// agent says so.
const stuckWarn = 5 * time.Second

// install maps buf at page idx of r, write-protected (clean until a WP
// fault says otherwise), and makes p, the page's entry, Resident and
// referenced (prefetched pages too: the stream is about to use them, CLOCK
// must not take them first). It returns nil as well when the page's range
// is gone; another error means nothing was installed (IsMMChanged: retry
// after reading events).
func (c *client) install(r *region, idx int, p Page, buf []byte) error {
	a := r.addr(idx)
	_, err := c.uffd.Copy(a, buf, userfaultfd.WriteProtected)
	if c.again(err) {
		_, err = c.uffd.Copy(a, buf, userfaultfd.WriteProtected)
	}
	switch {
	case err == nil:
		c.set(r, idx, p.With(Resident)|FlagRef)
	case userfaultfd.IsExist(err):
		// Mapped already, not by us: a child forked without FORK
		// events inherited it, after the copy of our page table that
		// FORK_PREPARE made, and may have written it. Dirty: its
		// contents go to the pool when it is evicted.
		c.dirty(r, idx, p.With(Resident)|FlagRef)
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsGone(err):
	default:
		return err
	}
	return nil
}

// poison makes page idx raise SIGBUS: every replica of its data is gone.
// An IsMMChanged error means: retry after reading events.
func (c *client) poison(r *region, idx int) error {
	a := r.addr(idx)
	if c.features.Has(userfaultfd.FeaturePoison) {
		c.st.lost.Add(1) // before the ioctl wakes the thread into its SIGBUS
		_, err := c.uffd.Poison(pageRange(a), 0)
		if userfaultfd.IsMMChanged(err) {
			c.st.lost.Add(^uint64(0))
			return err
		}
		c.log.Error("PAGE LOST: every replica of an evicted page is gone; the client gets SIGBUS",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Stringer("addr", a), zap.Uint64("region", r.id))
		if err == nil || userfaultfd.IsExist(err) || userfaultfd.IsGone(err) {
			if err != nil {
				c.uffd.Wake(pageRange(a))
			}
			return nil
		}
		c.log.Error("poison failed", zap.Error(err))
	} else {
		c.st.lost.Add(1)
		c.log.Error("PAGE LOST: every replica of an evicted page is gone; the client gets SIGBUS (no UFFDIO_POISON: the process is killed)",
			zap.Int("pid", int(c.pidAtm.Load())), zap.Stringer("addr", a), zap.Uint64("region", r.id))
	}
	// Never let the thread see zeros: stop the process.
	if pid := int(c.pidAtm.Load()); pid > 0 {
		unix.Kill(pid, unix.SIGBUS)
	}
	return nil
}

// fromStage installs a page from its staging slot and frees the slot.
func (c *client) fromStage(r *region, idx int, flags userfaultfd.Flags) error {
	slot := c.stageOf(r, idx)
	if slot < 0 {
		c.log.Error("staged page without a slot", zap.Uint64("region", r.id), zap.Int("page", idx))
		return nil
	}
	a := r.addr(idx)
	_, err := c.uffd.Copy(a, c.ev.staging[slot*pageSize:(slot+1)*pageSize], flags)
	exist := userfaultfd.IsExist(err)
	switch {
	case err == nil:
	case exist:
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsGone(err):
	default:
		if !userfaultfd.IsMMChanged(err) {
			c.log.Error("copy from staging failed", zap.Error(err))
		}
		return err
	}
	p := r.pages[idx]
	if p.State() == Staged {
		c.ev.staged--
	}
	if p.State() == Staged || exist { // mapped already, not by us: see installRead
		c.dirty(r, idx, p.With(Resident)|FlagRef) // a Staged page's slot was never written
	} else {
		c.set(r, idx, p.With(Resident)|FlagRef)
	}
	c.freeStage(slot)
	return nil
}

func (c *client) stageOf(r *region, idx int) int {
	for s, o := range c.ev.stageOwner {
		if o.r == r && o.idx == idx {
			return s
		}
	}
	return -1
}

func (c *client) freeStage(s int) {
	c.ev.stageOwner[s] = pageRef{}
	c.cj.stage(s, 0, 0, false)
	c.ev.stageFree = append(c.ev.stageFree, uint32(s))
}

// retryHeld serves again the faults whose READ found no replica reachable.
func (c *client) retryHeld() {
	if len(c.fq.retry) == 0 {
		return
	}
	now := time.Now()
	pending := c.fq.retry
	c.fq.retry, c.fq.retrySpare = c.fq.retrySpare[:0], pending
	for _, h := range pending {
		if !h.r.gone {
			c.fault(h.r.addr(h.idx), h.flags, h.since)
		}
	}
	c.flushReads(now)
}
