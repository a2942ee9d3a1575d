package pager

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
	"rmem/spin"
	"rmem/userfaultfd"
)

// A client's state, by concern, and its making.

// pageSize is the only page size the pager handles (base pages).
const pageSize = 4096

const (
	maxMsgs     = 64   // uffd messages read per wake-up
	maxBatch    = 128  // READs per batch (faults + prefetches)
	maxHeld     = 4096 // faults waiting for an eviction or a retry
	retryPeriod = 5 * time.Millisecond
)

// client is one client process and the loop that serves it: an assembly
// of parts, one per concern, each a type with the methods that keep it
// (its file in parentheses). Everything but ctl, wakefd, done, the atomics
// and the counters is owned by the loop goroutine.
type client struct {
	a    *Agent
	id   uint64
	log  *zap.Logger
	uffd gatedUFFD
	io   remote.PageIO
	st   counters

	ctl    control // what the agent's goroutines hand the loop
	wakefd int
	done   chan struct{}
	pidAtm atomic.Int64
	uid    atomic.Uint32 // the client's user (SO_PEERCRED)
	hello  atomic.Uint32 // its HELLO's flags (proto.HelloFlags), set when it says it
	bud    budgetAsk     // its budget: asked for, and steered (budget.go)

	// Loop state, by concern.
	sock     socketState // the process: its socket, pidfd and packets (conn.go)
	regs     regions
	fq       faultQueue // uffd messages read, faults held (install.go)
	rd       readBatch  // the batch's READs (reads.go)
	room     roomState  // the pool's room and what was said about it (room.go)
	fk       forkState  // forks, and a fork waiting for the eviction in flight (forkstate.go)
	ev       evictState // CLOCK, staging slots and the eviction in flight (evictstate.go)
	sample   samples
	features userfaultfd.Feature

	cj *clientJournal // what a next agent needs to resume it (journal.go); nil: none

	ring *faultRing // the fault ring of a client whose uffd raises SIGBUS (ring.go); nil: faults come from the uffd

	spin *spin.Waiter // how long the loop polls before it blocks
}

// control is what the agent's goroutines hand the loop, under its mutex:
// a connection (a forked child's HELLO) with its pid, and the stop flag.
type control struct {
	mu      sync.Mutex
	pid     int
	pending *net.UnixConn
	stop    bool
}

// hand gives the loop conn, the connection of process pid.
func (ct *control) hand(conn *net.UnixConn, pid int) {
	ct.mu.Lock()
	ct.pending, ct.pid = conn, pid
	ct.mu.Unlock()
}

// stopLoop asks the loop to stop.
func (ct *control) stopLoop() {
	ct.mu.Lock()
	ct.stop = true
	ct.mu.Unlock()
}

// take returns whether to stop, and the connection handed since the last
// take (nil: none) with its pid.
func (ct *control) take() (stop bool, conn *net.UnixConn, pid int) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	conn, ct.pending = ct.pending, nil
	return ct.stop, conn, ct.pid
}

// stopped reports whether the agent stopped the loop (rather than the
// client going away).
func (ct *control) stopped() bool {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.stop
}

// closePending closes a connection handed and never taken.
func (ct *control) closePending() {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if ct.pending != nil {
		ct.pending.Close()
		ct.pending = nil
	}
}

// faultQueue is the fault path's queues: uffd messages read, and read
// ahead (again), the poll set, the prefetcher's answer, and faults held
// for an eviction in flight (held) or a retry.
type faultQueue struct {
	msgs       []userfaultfd.Msg
	pfds       []unix.PollFd
	pfOut      []int64
	held       []heldFault
	retry      []heldFault
	retrySpare []heldFault
	early      []userfaultfd.Msg // messages read ahead by again
	earlySpare []userfaultfd.Msg
	// holes: faults of processes on shared memory that the agent's own
	// client serves (shmowner.go), waiting for their pages.
	holes []holeFault
	// zapped: the punches of shared memory this turn forgot, answered
	// (closed) once its holes are served (shmowner.go's serveHoles).
	zapped []chan struct{}
}

// takeRetry returns the faults held for a retry, emptying the list (its
// spare takes the faults held again meanwhile).
func (q *faultQueue) takeRetry() []heldFault {
	pending := q.retry
	q.retry, q.retrySpare = q.retrySpare[:0], pending
	return pending
}

// takeEarly returns the messages read ahead, emptying the list.
func (q *faultQueue) takeEarly() []userfaultfd.Msg {
	batch := q.early
	q.early, q.earlySpare = q.earlySpare[:0], batch
	return batch
}

// newClient prepares a client for uffd (owned from now on); the loop
// starts with run.
func (a *Agent) newClient(u faultFD, features userfaultfd.Feature) (*client, error) {
	return a.newClientWith(u, features, -1, a.opts.StagingSlots, 0)
}

// newClientWith is newClient with a staging memfd of slots pages (sfd, owned
// from now on; -1: a new one) and client id (0: a new one). A client whose
// uffd raises SIGBUS takes its faults from the fault ring, the page of the
// staging memfd after the slots (ring.go): a new one, or the one of the
// staging memfd it resumes with.
func (a *Agent) newClientWith(u faultFD, features userfaultfd.Feature, sfd, slots int, id uint64) (*client, error) {
	size := slots * pageSize
	withRing := features.Has(userfaultfd.FeatureSigbus)
	if withRing {
		size += proto.RingSize
	}
	adopt := sfd >= 0
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
			err = unix.Ftruncate(sfd, int64(size))
		}
	}
	var staging []byte
	if err == nil {
		staging, err = unix.Mmap(sfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
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
		wakefd: wfd, done: make(chan struct{}), spin: spin.New(loopSpin(spin.Resolve(a.opts.Spin), withRing), a.opts.SpinSite),
		sock: socketState{sockfd: -1, pidfd: -1,
			sendBuf: make([]byte, 0, proto.MaxPacket), recvBuf: make([]byte, proto.MaxPacket),
			oob: make([]byte, proto.OOBSize)},
		fq: faultQueue{
			msgs:  make([]userfaultfd.Msg, maxMsgs),
			pfds:  make([]unix.PollFd, 0, 4),
			pfOut: make([]int64, a.opts.MaxPrefetch),
			held:  make([]heldFault, 0, maxHeld), retry: make([]heldFault, 0, maxHeld),
			retrySpare: make([]heldFault, 0, maxHeld),
			early:      make([]userfaultfd.Msg, 0, maxMsgs), earlySpare: make([]userfaultfd.Msg, 0, maxMsgs)},
		rd: readBatch{
			reads: make([]remote.PageOp, 0, maxBatch), at: make([]readRef, 0, maxBatch),
			merged: make([]remote.PageOp, 0, maxBatch), mergedAt: make([]int, 0, maxBatch),
			bufs: make([]byte, maxBatch*pageSize)},
		fk:     forkState{parked: make([]userfaultfd.Msg, 0, 2*maxMsgs), parkedSpare: make([]userfaultfd.Msg, 0, 2*maxMsgs)},
		sample: samples{buf: make([]byte, (sampleSlots+markerSlots)*pageSize)},
		ev: evictState{stagingFD: sfd, staging: staging[:slots*pageSize],
			stageFree: make([]uint32, 0, slots), stageOwner: make([]pageRef, slots),
			wb: make([]remote.PageOp, 0, proto.MaxEvictBatch), wbRef: make([]int, 0, proto.MaxEvictBatch),
			wbRuns: make([]remote.PageOp, 0, proto.MaxEvictBatch), wbRunAt: make([]int, 0, proto.MaxEvictBatch),
			victims: make([]Victim, proto.MaxEvictBatch)},
	}
	for s := slots - 1; s >= 0; s-- {
		c.ev.stageFree = append(c.ev.stageFree, uint32(s))
	}
	c.ev.clock.Skip = func(t int) bool { return c.regs.list[t].pinned }
	if withRing {
		c.ring = newFaultRing(staging[slots*pageSize:], adopt, &c.st.ring)
		c.ring.stall = &c.st.stall // the waits of its misses, measured by the ring
		c.uffd.ring = c.ring
	}
	c.log = a.log.With(zap.Uint64("client", c.id))
	if lr, ok := io.(localRegistrar); ok {
		for _, mem := range [][]byte{c.rd.bufs, c.ev.staging} {
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

// wake wakes the client's loop (its eventfd), from any goroutine.
func (c *client) wake() {
	var one = [8]byte{1}
	unix.Write(c.wakefd, one[:])
}

// says reports whether c's HELLO set one of flags.
func (c *client) says(flags proto.HelloFlags) bool {
	return proto.HelloFlags(c.hello.Load())&flags != 0
}
