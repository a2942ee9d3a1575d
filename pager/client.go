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
	maxThrottle = 50 * time.Millisecond
	probePeriod = time.Second
)

// client is one client process and the loop that serves it. Everything
// but the fields under mu and the counters is owned by the loop goroutine.
type client struct {
	a    *Agent
	id   uint64
	log  *zap.Logger
	uffd gatedUFFD
	io   remote.PageIO
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

	spin *spin.Waiter // how long the loop polls before it blocks
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
	reads       []remote.PageOp
	readAt      []readRef
	merged      []remote.PageOp // reads joined into runs (merge)
	mergedAt    []int           // first read of each merged op
	bufs        []byte
	pfOut       []int64
	held        []heldFault
	retry       []heldFault
	retrySpare  []heldFault
	early       []userfaultfd.Msg // messages read ahead by again
	earlySpare  []userfaultfd.Msg
	parked      []userfaultfd.Msg // a FORK event and what came after it, waiting for the eviction in flight (park)
	parkedSpare []userfaultfd.Msg
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

// stageBuf returns staging slot s's page of the staging area.
func (e *evictState) stageBuf(s int) []byte { return e.staging[s*pageSize : (s+1)*pageSize] }

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
	wb         []remote.PageOp
	wbRef      []int
	wbRuns     []remote.PageOp // wb merged into runs (writeBack)
	wbRunAt    []int           // the first op of wb in each run
	wbBuf      []byte          // the pages of runs, copied in order (made at the first merge)
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
		wakefd: wfd, done: make(chan struct{}), spin: spin.New(spin.Resolve(a.opts.Spin), a.opts.SpinSite),
		sock: socketState{sockfd: -1, pidfd: -1,
			sendBuf: make([]byte, 0, proto.MaxPacket), recvBuf: make([]byte, proto.MaxPacket),
			oob: make([]byte, proto.OOBSize)},
		fq: faultQueue{
			msgs:  make([]userfaultfd.Msg, maxMsgs),
			pfds:  make([]unix.PollFd, 0, 4),
			reads: make([]remote.PageOp, 0, maxBatch), readAt: make([]readRef, 0, maxBatch),
			merged: make([]remote.PageOp, 0, maxBatch), mergedAt: make([]int, 0, maxBatch),
			bufs:  make([]byte, maxBatch*pageSize),
			pfOut: make([]int64, a.opts.MaxPrefetch),
			held:  make([]heldFault, 0, maxHeld), retry: make([]heldFault, 0, maxHeld),
			retrySpare: make([]heldFault, 0, maxHeld),
			early:      make([]userfaultfd.Msg, 0, maxMsgs), earlySpare: make([]userfaultfd.Msg, 0, maxMsgs),
			parked: make([]userfaultfd.Msg, 0, 2*maxMsgs), parkedSpare: make([]userfaultfd.Msg, 0, 2*maxMsgs)},
		sample: samples{buf: make([]byte, (sampleSlots+markerSlots)*pageSize)},
		ev: evictState{stagingFD: sfd, staging: staging,
			stageFree: make([]uint32, 0, slots), stageOwner: make([]pageRef, slots),
			wb: make([]remote.PageOp, 0, proto.MaxEvictBatch), wbRef: make([]int, 0, proto.MaxEvictBatch),
			wbRuns: make([]remote.PageOp, 0, proto.MaxEvictBatch), wbRunAt: make([]int, 0, proto.MaxEvictBatch),
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

// maxForkPause bounds how long a FORK_PREPARE pauses evictions without its
// FORK_DONE (the shim sends it as soon as fork(2) returns).
const maxForkPause = 10 * time.Second

// forkStalled reports whether evictions are paused for a fork; a pause
// whose FORK_DONE never came ends after maxForkPause, so that a shim that
// failed to send it does not leave the process over budget for good.
func (c *client) forkStalled() bool {
	if c.fk.forking == 0 {
		return false
	}
	if c.fk.preparing {
		return true // forkSettled ends it
	}
	if time.Since(c.fk.forkedAt) > maxForkPause {
		c.log.Warn("no FORK_DONE after FORK_PREPARE; evictions resume", zap.Uint64("serial", c.fk.forking))
		c.fk.forking = 0
		return false
	}
	return true
}
