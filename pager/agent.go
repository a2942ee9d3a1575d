package pager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
	"rmem/procinfo"
	"rmem/spin"
	"rmem/userfaultfd"
)

// DefaultFaultTimeout is Options.FaultTimeout's default.
const DefaultFaultTimeout = 60 * time.Second

// ErrOptions: invalid Options; the error names the field.
var ErrOptions = errors.New("pager: invalid options")

// Options configure an Agent.
type Options struct {
	// Socket is the Unix socket path clients connect to (default
	// proto.DefaultSocket). An existing socket file there is replaced.
	Socket string
	// SocketMode is the socket file's mode (default 0660).
	SocketMode os.FileMode
	// AllowUIDs are the user ids allowed to connect besides root and the
	// agent's own (SO_PEERCRED).
	AllowUIDs []uint32
	// SocketGroup, when nonzero, is the group id the socket file is given:
	// with SocketMode 0660 its members may connect, and the agent serves
	// any process that has the group (primary or supplementary, read from
	// /proc/PID/status).
	SocketGroup int
	// Store supplies remote memory. Required.
	Store remote.Store
	// LocalMem is each client process's budget of resident bytes
	// (required, at least 64 KiB).
	LocalMem uint64
	// NodeMem bounds the resident bytes of all clients together; it is
	// split evenly among the clients with a fixed budget, and by how much
	// each gains per page among those steered by a slowdown target (0: no
	// node-wide bound).
	NodeMem uint64
	// MaxSlowdown, when nonzero, is each client's default slowdown target
	// (a fraction: 0.02 is 2%): its budget is steered so that its threads
	// spend at most that share of wall time in misses (slowdown.go,
	// steer.go), and LocalMem is the budget's ceiling. A client's HELLO may
	// ask for its own target.
	MaxSlowdown float64
	// MinAlloc is the allocation size from which the shim pages memory,
	// sent in WELCOME (0: the shim's default).
	MinAlloc uint64
	// StagingSlots is the pages of each client's staging area (default
	// 256; at least proto.MaxEvictBatch).
	StagingSlots int
	// MaxPrefetch is the deepest prefetch in pages (default 128; negative
	// disables prefetching).
	MaxPrefetch int
	// StateDir, when set, keeps what a next agent needs to resume this
	// one's clients if it dies (journal.go; memagent serve: /run/rmem/agent),
	// and this agent resumes the clients a previous one left there.
	StateDir string
	// ResumeWait is how long a previous agent's clients have to come back
	// before their pages are dropped (default 1 minute).
	ResumeWait time.Duration
	// HandshakeTimeout bounds a client's HELLO (default 5s).
	HandshakeTimeout time.Duration
	// FaultTimeout bounds how long a fault waits for a pool that does not
	// answer (no replica of its page reachable, or write-backs failing
	// with the client at its budget): then its page is given up (SIGBUS),
	// or the budget bends. A full pool is waited for however long. Default
	// 60s; negative: wait forever.
	FaultTimeout time.Duration
	// Spin is how long a client's loop polls for its next event before it
	// blocks, adapted to how fast they come (package spin): 0 means
	// spin.DefaultMax, a negative value never. Spinning saves the wake-up
	// of a halted vCPU per fault (tens of µs on VMs whose idle vCPUs halt
	// at once) for at most that much CPU after each event.
	Spin time.Duration
	// SpinSite, when set, counts the loops' polling (the daemon exports
	// it with its other sites).
	SpinSite *spin.Site
	// Log receives the agent's logs (default: none).
	Log *zap.Logger
	// Registry, when set, gets the agent's Prometheus collector.
	Registry prometheus.Registerer
	// Now is the clock the agent's decisions read (default time.Now): when
	// to evict, throttle or give up a fault, how long a fork pauses
	// evictions, the pool's pacing (slots.go), how long a fork's copy or a
	// previous agent's client waits. A client's loop reads it once per
	// turn, when poll returns, and passes that time down to the parts it
	// runs (and once per batch of faults read, their arrival); fault
	// latencies are measured with it too. Tests pass a fake one and move it
	// on. Deadlines of socket I/O (the handshake) are the kernel's and read
	// the real clock.
	Now func() time.Time
	// LoopsChanged, when set, is called as a client's loop starts and
	// ends with the number of loops then running (one call at a time, in
	// order). Each loop is a goroutine locked to its OS thread: the daemon
	// sizes GOMAXPROCS with it (internal/agentd); the library does not.
	LoopsChanged func(running int)
}

// Validate checks the options, naming the bad field.
func (o *Options) Validate() error {
	switch {
	case o.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrOptions)
	case o.LocalMem < minLocalMem:
		return fmt.Errorf("%w: LocalMem %d: want at least %d bytes", ErrOptions, o.LocalMem, minLocalMem)
	case o.NodeMem != 0 && o.NodeMem < 16*pageSize:
		return fmt.Errorf("%w: NodeMem %d: want 0 or at least %d bytes", ErrOptions, o.NodeMem, 16*pageSize)
	case o.StagingSlots != 0 && (o.StagingSlots < proto.MaxEvictBatch || o.StagingSlots > proto.MaxStagingSlots):
		return fmt.Errorf("%w: StagingSlots %d: want %d..%d", ErrOptions, o.StagingSlots, proto.MaxEvictBatch, proto.MaxStagingSlots)
	case o.MaxSlowdown < 0 || o.MaxSlowdown >= 1:
		return fmt.Errorf("%w: MaxSlowdown %v: want 0 (off) or a fraction under 1", ErrOptions, o.MaxSlowdown)
	case o.HandshakeTimeout < 0:
		return fmt.Errorf("%w: HandshakeTimeout %v is negative", ErrOptions, o.HandshakeTimeout)
	case o.SocketMode&^os.ModePerm != 0:
		return fmt.Errorf("%w: SocketMode %v: permission bits only", ErrOptions, o.SocketMode)
	}
	if ss := o.Store.SlabSize(); ss == 0 || ss%pageSize != 0 {
		return fmt.Errorf("%w: Store: slab size %d is not a multiple of %d", ErrOptions, ss, pageSize)
	}
	return nil
}

// Agent serves the page faults of client processes: it accepts clients on
// a Unix socket and runs one loop per client process.
type Agent struct {
	opts  Options
	log   *zap.Logger
	ln    *net.UnixListener
	slots *slotPool // the agent's pool space, shared by every client

	ctx    context.Context // cancelled by Close: ends remote I/O
	cancel context.CancelFunc
	wg     sync.WaitGroup
	nextID atomic.Uint64

	mu      sync.Mutex
	cond    *sync.Cond
	clients map[uint64]*client
	forked  map[forkKey]*client   // forked children waiting for their HELLO
	copies  map[forkKey]*forkCopy // FORK_PREPARE copies waiting for their child's HELLO
	exited  []ClientStats         // final stats of the last maxExited clients
	// gone sums the counters of every client that has exited, for the
	// metrics' "exited" series (metrics.go).
	gone     ClientStats
	closed   bool
	nclients atomic.Int64

	loops loopCount // the client loops running, for Options.LoopsChanged

	watch turnWatch // told after each turn of a loop, round of the reservoir, client started or dropped

	// childUFFD makes the uffd of a child from a FORK event's descriptor
	// (userfaultfd.FromFD; a fake kernel's in the core tests).
	childUFFD func(fd int, features userfaultfd.Feature) (faultFD, error)

	journal  *journal        // StateDir's (nil: none)
	orphans  map[int]*orphan // a previous agent's clients waiting to resume, by pid
	resumeBy time.Time       // and until when (Options.ResumeWait)
	leaked   []remote.SlabID // slabs the lease holds that no journal names

	shm *sharedTable // shared memory segments (shared.go)
}

type forkKey struct {
	ppid   int
	serial uint64
}

// New validates opts, listens on the socket and returns the Agent; Run
// accepts clients.
func New(opts Options) (*Agent, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if userfaultfd.PageSize != pageSize {
		return nil, fmt.Errorf("pager: page size %d is not supported (want %d)", userfaultfd.PageSize, pageSize)
	}
	if opts.Socket == "" {
		opts.Socket = proto.DefaultSocket
	}
	if opts.SocketMode == 0 {
		opts.SocketMode = 0o660
	}
	if opts.StagingSlots == 0 {
		opts.StagingSlots = 256
	}
	if opts.MaxPrefetch == 0 {
		opts.MaxPrefetch = 128
	}
	if opts.MaxPrefetch < 0 {
		opts.MaxPrefetch = 0
	}
	if opts.HandshakeTimeout == 0 {
		opts.HandshakeTimeout = 5 * time.Second
	}
	if opts.FaultTimeout == 0 {
		opts.FaultTimeout = DefaultFaultTimeout
	}
	if opts.ResumeWait == 0 {
		opts.ResumeWait = DefaultResumeWait
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if fi, err := os.Lstat(opts.Socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(opts.Socket)
	}
	ln, err := proto.Listen(opts.Socket)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(opts.Socket, opts.SocketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("pager: chmod socket: %w", err)
	}
	if opts.SocketGroup != 0 {
		if err := os.Chown(opts.Socket, -1, opts.SocketGroup); err != nil {
			ln.Close()
			return nil, fmt.Errorf("pager: socket group: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &Agent{
		opts: opts, log: opts.Log, ln: ln, slots: newSlotPool(opts.Store, opts.Log.Named("slots"), opts.Now),
		ctx: ctx, cancel: cancel,
		clients: map[uint64]*client{}, forked: map[forkKey]*client{}, copies: map[forkKey]*forkCopy{},
		childUFFD: func(fd int, f userfaultfd.Feature) (faultFD, error) { return userfaultfd.FromFD(fd, f) },
	}
	a.cond = newCond(a)
	a.shm = newSharedTable(a)
	a.slots.onRoom = a.wakeAll
	a.slots.trim.copies = a.poolCopies
	a.orphans = map[int]*orphan{}
	if checkInvariants {
		a.log.Warn("RMEM_CHECK_STATE=1: each client's loop checks its whole state after every batch (slow; it panics at the first thing wrong)")
	}
	if opts.StateDir != "" {
		if err := a.loadJournal(); err != nil {
			ln.Close()
			cancel()
			return nil, fmt.Errorf("pager: state dir %s: %w", opts.StateDir, err)
		}
	}
	if opts.Registry != nil {
		if err := opts.Registry.Register(&collector{a}); err != nil {
			ln.Close()
			cancel()
			return nil, fmt.Errorf("pager: register metrics: %w", err)
		}
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.freeLeaked()
		a.slots.RoutineReservoir(ctx, a.watch.note)
	}()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.RoutineSteer(ctx)
	}()
	return a, nil
}

// wakeAll wakes every client loop (the pool has room again).
func (a *Agent) wakeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.clients {
		c.wake()
	}
}

// poolCopies returns how many pages of all clients the pool holds a copy
// of while they are resident and clean (pool slots named, not remote).
func (a *Agent) poolCopies() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := int64(0)
	for _, c := range a.clients {
		n += max(c.st.pooled.Load()-c.st.remote.Load(), 0)
	}
	return int(n)
}

// Pool returns the agent's pool space: what it holds and what holds data.
func (a *Agent) Pool() PoolStats { return a.slots.stats() }

func newCond(a *Agent) *sync.Cond { return sync.NewCond(&a.mu) }

// Addr returns the socket path.
func (a *Agent) Addr() string { return a.opts.Socket }

// Run accepts clients until ctx ends or Close is called; it returns nil
// after Close and ctx.Err() when ctx ended (Close must still be called).
func (a *Agent) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { a.ln.Close() })
	defer stop()
	for {
		conn, err := a.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return nil
			}
			a.log.Warn("accept failed", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			conn.Close()
			return nil
		}
		a.wg.Add(1)
		a.mu.Unlock()
		go func() {
			defer a.wg.Done()
			a.handshake(conn)
		}()
	}
}

// Close stops accepting, stops every client loop and waits for all of the
// agent's goroutines. Clients keep their uffd: their next fault on a page
// the agent evicted blocks until an agent takes the uffd back, never reads
// zeros. Slabs are not freed here (the Store's owner ends the lease). Safe
// to call twice.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	a.shm.close() // its owner is a client: while the loops run
	a.mu.Lock()
	clients := make([]*client, 0, len(a.clients))
	for _, c := range a.clients { // forked children waiting for HELLO too
		clients = append(clients, c)
	}
	a.cond.Broadcast()
	a.mu.Unlock()
	a.ln.Close()
	a.cancel()
	for _, c := range clients {
		c.shutdown()
	}
	a.wg.Wait()
	a.mu.Lock()
	for _, o := range a.orphans { // left for the agent after this one
		o.cj.detach(o.regions)
	}
	a.orphans = nil
	a.mu.Unlock()
	a.journal.close()
	return nil
}

// handshake reads a client's HELLO, checks its credentials and starts (or
// attaches it to) its loop.
func (a *Agent) handshake(conn *net.UnixConn) {
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	conn.SetDeadline(time.Now().Add(a.opts.HandshakeTimeout))
	cred, err := userfaultfd.PeerCred(conn)
	if err != nil {
		a.log.Warn("peer credentials unavailable", zap.Error(err))
		return
	}
	buf := make([]byte, proto.MaxPacket)
	oob := make([]byte, proto.OOBSize)
	var fds [proto.MaxFDs]int
	pkt, nfds, err := proto.Recv(conn, buf, oob, fds[:])
	if errors.Is(err, io.EOF) {
		// Closed without a word: a liveness probe (memagent run checks
		// for a running agent this way).
		a.log.Debug("connection closed before HELLO", zap.Int32("pid", cred.Pid))
		return
	}
	if err != nil {
		a.log.Warn("no HELLO from client", zap.Int32("pid", cred.Pid), zap.Error(err))
		return
	}
	closeFDs := func() {
		for _, fd := range fds[:nfds] {
			unix.Close(fd)
		}
		nfds = 0
	}
	refuse := func(h proto.Header, errno unix.Errno, why string) {
		closeFDs()
		a.log.Warn("client refused", zap.Int32("pid", cred.Pid), zap.Uint32("uid", cred.Uid), zap.String("why", why))
		conn.SetDeadline(time.Now().Add(time.Second))
		proto.Send(conn, buf, 1, &proto.Error{Seq: h.Seq, Errno: errno, Text: why})
	}
	if h, _, err := proto.Parse(pkt); err == nil && h.Type == proto.TypeUFFDDevice {
		closeFDs() // a UFFD_DEVICE carries none
		if pkt, nfds, err = a.lendUFFDDevice(conn, cred, pkt, buf, oob, fds[:], refuse); err != nil {
			a.log.Warn("no HELLO after UFFD_DEVICE", zap.Int32("pid", cred.Pid), zap.Error(err))
			return
		}
		if pkt == nil {
			return // refused
		}
	}
	if h, _, err := proto.Parse(pkt); err == nil && h.Type == proto.TypeHandoff {
		closeFDs() // a HANDOFF carries none
		a.handoffOnce(conn, cred, pkt, buf, refuse)
		return
	}
	var hello proto.Hello
	h, err := proto.Expect(pkt, &hello)
	if err == nil && hello.Flags&proto.HelloResume != 0 && a.allowed(cred) && hello.PID == cred.Pid && hello.PageSize == pageSize {
		conn.SetDeadline(time.Now().Add(resumeTimeout))
		n := nfds
		nfds = 0 // owned by resume from here
		ok = a.resume(conn, cred, h, &hello, fds[:n], buf, oob, refuse)
		return
	}
	if !a.admits(h, err, cred, refuse) {
		return
	}
	switch {
	case hello.PID != cred.Pid && hello.Flags&proto.HelloTraced == 0:
		refuse(h, unix.EPERM, fmt.Sprintf("HELLO says pid %d, the socket says %d", hello.PID, cred.Pid))
		return
	case hello.Flags&proto.HelloTraced != 0 && !tracedBy(int(hello.PID), int(cred.Pid)):
		refuse(h, unix.EPERM, fmt.Sprintf("HELLO speaks for pid %d, which pid %d does not trace", hello.PID, cred.Pid))
		return
	case hello.PageSize != pageSize:
		refuse(h, unix.EINVAL, fmt.Sprintf("page size %d is not supported", hello.PageSize))
		return
	case hello.LocalMem != 0 && hello.LocalMem < minLocalMem:
		refuse(h, unix.EINVAL, fmt.Sprintf("local memory budget %d bytes is below %d", hello.LocalMem, minLocalMem))
		return
	}
	if hello.Flags&proto.HelloTraced != 0 {
		// Checked above: the sender traces hello.PID, for which it speaks.
		speaksFor := *cred
		speaksFor.Pid = hello.PID
		cred = &speaksFor
	}
	welcome := proto.Welcome{MinAlloc: a.opts.MinAlloc, StagingSlots: uint32(a.opts.StagingSlots)}
	var c *client
	if hello.Flags&proto.HelloUFFD != 0 {
		// A top-level process, or a child forked without FORK events
		// that registered a uffd of its own: it takes the copy of its
		// parent's pages that FORK_PREPARE made.
		var fc *forkCopy
		if hello.ForkSerial != 0 {
			if fc = a.takeForkCopy(forkKey{int(hello.PPID), hello.ForkSerial}, cred); fc == nil {
				refuse(h, unix.ENOENT, fmt.Sprintf("no FORK_PREPARE of fork %d of pid %d for this process", hello.ForkSerial, hello.PPID))
				return
			}
		}
		c = a.newClientFromHello(h, &hello, fds[:nfds], refuse)
		nfds = 0 // closed by refuse, or owned by c
		if c == nil {
			if fc != nil {
				a.freeRegions(fc.regs)
			}
			return
		}
		if fc != nil {
			c.adopt(fc.regs)
			if hello.LocalMem == 0 {
				c.bud.localMem.Store(fc.localMem)
			}
			if hello.MaxSlowdown == 0 {
				c.bud.maxSlowdown.Store(fc.maxSlowdown)
			}
		}
		c.uid.Store(cred.Uid)
		c.hello.Store(uint32(hello.Flags))
		welcome.ClientID = c.id
		if err := proto.Send(conn, buf, 1, &welcome, c.welcomeFDs(&welcome, c.ev.stagingFD)...); err != nil {
			a.log.Warn("sending WELCOME failed", zap.Error(err))
			c.teardownUnstarted()
			return
		}
		if !a.start(c) {
			return
		}
	} else {
		closeFDs()
		c = a.takeForkChild(int(hello.PPID), hello.ForkSerial, cred, time.Now().Add(a.opts.HandshakeTimeout))
		if c == nil {
			refuse(h, unix.ENOENT, fmt.Sprintf("no fork %d of pid %d known", hello.ForkSerial, hello.PPID))
			return
		}
		c.hello.Store(uint32(hello.Flags))
		if hello.LocalMem != 0 {
			c.bud.localMem.Store(hello.LocalMem)
		}
		if hello.MaxSlowdown != 0 {
			c.bud.maxSlowdown.Store(hello.MaxSlowdown)
		}
		if (hello.Flags&proto.HelloRing != 0) != (c.ring != nil) {
			// Its uffd is a copy of its parent's: the same features. The
			// loop keeps serving it (stopping would close the uffd: its
			// threads would read zeros); it only has no connection.
			refuse(h, unix.EINVAL, "a forked child's HELLO must ask for the fault ring if and only if its parent's did")
			return
		}
		welcome.ClientID = c.id
		welcome.Flags = proto.WelcomeUFFD
		if err := proto.Send(conn, buf, 1, &welcome, c.welcomeFDs(&welcome, c.ev.stagingFD, c.uffd.Fd())...); err != nil {
			a.log.Warn("sending WELCOME failed", zap.Error(err))
			return
		}
	}
	conn.SetDeadline(time.Time{})
	ok = true
	a.log.Info("client connected", zap.Uint64("client", c.id), zap.Int32("pid", cred.Pid), zap.Uint64("fork", hello.ForkSerial),
		zap.Bool("traced", hello.Flags&proto.HelloTraced != 0))
	c.attach(conn, int(cred.Pid))
}

// welcomeFDs returns the descriptors of c's WELCOME w, fds and the
// doorbell of its fault ring if it has one (then w says so).
func (c *client) welcomeFDs(w *proto.Welcome, fds ...int) []int {
	if c.ring == nil {
		return fds
	}
	w.Flags |= proto.WelcomeRing
	return append(fds, c.wakefd)
}

// newClientFromHello makes a client of the uffd a HELLO carried (fds, all
// closed on failure), or refuses the HELLO and returns nil.
func (a *Agent) newClientFromHello(h proto.Header, hello *proto.Hello, fds []int, refuse func(proto.Header, unix.Errno, string)) *client {
	if len(fds) != 1 {
		refuse(h, unix.EINVAL, "a HELLO with the uffd flag carries exactly its uffd")
		return nil
	}
	if link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fds[0])); err != nil || link != "anon_inode:[userfaultfd]" {
		refuse(h, unix.EBADF, "the descriptor is not a userfaultfd")
		return nil
	}
	u, err := userfaultfd.FromFD(fds[0], hello.Features)
	if err != nil {
		refuse(h, unix.EBADF, "not a userfaultfd: "+err.Error())
		return nil
	}
	c, err := a.newClient(u, hello.Features)
	if err != nil {
		u.Close()
		refuse(h, unix.ENOMEM, err.Error())
		return nil
	}
	c.bud.localMem.Store(hello.LocalMem)
	c.bud.maxSlowdown.Store(hello.MaxSlowdown)
	return c
}

// handoffOnce answers a HANDOFF (pkt) made on a connection of its own by
// a process that is not a client: a child of one, forked without regions
// or by vfork, about to exec or to pass descriptors over a socket
// (docs/pager.md, "Shared memory"). It speaks for itself only.
func (a *Agent) handoffOnce(conn *net.UnixConn, cred *unix.Ucred, pkt, buf []byte, refuse func(proto.Header, unix.Errno, string)) {
	var m proto.Handoff
	h, err := proto.Expect(pkt, &m)
	if !a.admits(h, err, cred, refuse) {
		return
	}
	if m.PID != cred.Pid {
		refuse(h, unix.EPERM, fmt.Sprintf("HANDOFF of process %d, the socket says %d", m.PID, cred.Pid))
		return
	}
	conn.SetDeadline(time.Time{}) // (a release may take seconds)
	reply := replyTo(h.Seq, a.shm.handoff(&m))
	conn.SetDeadline(time.Now().Add(time.Second))
	proto.Send(conn, buf, 1, reply)
}

// lendUFFDDevice answers a UFFD_DEVICE request (pkt) with a descriptor of
// /dev/userfaultfd, and returns the packet that follows (the HELLO); a nil
// packet and no error when it refused the request.
func (a *Agent) lendUFFDDevice(conn *net.UnixConn, cred *unix.Ucred, pkt, buf, oob []byte, fds []int,
	refuse func(proto.Header, unix.Errno, string)) ([]byte, int, error) {
	var req proto.UFFDDevice
	h, err := proto.Expect(pkt, &req)
	if !a.admits(h, err, cred, refuse) {
		return nil, 0, nil
	}
	dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		errno := unix.ENODEV
		errors.As(err, &errno)
		refuse(h, errno, "the agent cannot open /dev/userfaultfd: "+err.Error())
		return nil, 0, nil
	}
	err = proto.Send(conn, buf, 1, &proto.Ack{Seq: h.Seq}, dev)
	unix.Close(dev)
	if err != nil {
		return nil, 0, err
	}
	a.log.Debug("lent /dev/userfaultfd", zap.Int32("pid", cred.Pid), zap.Uint32("uid", cred.Uid))
	return proto.Recv(conn, buf, oob, fds)
}

// admits reports whether the agent takes a first request h (err: its
// decoding's) from the peer cred; if not, it refuses it.
func (a *Agent) admits(h proto.Header, err error, cred *unix.Ucred, refuse func(proto.Header, unix.Errno, string)) bool {
	switch {
	case err != nil:
		refuse(h, unix.EPROTO, err.Error())
	case !a.allowed(cred):
		refuse(h, unix.EACCES, fmt.Sprintf("uid %d may not use this agent", cred.Uid))
	default:
		return true
	}
	return false
}

// allowed reports whether the agent serves the peer cred: root, the
// agent's own user, AllowUIDs, and members of SocketGroup.
func (a *Agent) allowed(cred *unix.Ucred) bool {
	return allowed(cred, &a.opts, uint32(os.Geteuid()), procinfo.Groups)
}

// allowed decides for an agent of user self with opts, reading a peer's
// supplementary groups with groups only when they decide it.
func allowed(cred *unix.Ucred, opts *Options, self uint32, groups func(pid int) ([]int, error)) bool {
	uid := cred.Uid
	if uid == 0 || uid == self || slices.Contains(opts.AllowUIDs, uid) {
		return true
	}
	g := opts.SocketGroup
	if g == 0 {
		return false
	}
	if cred.Gid == uint32(g) {
		return true
	}
	gs, err := groups(int(cred.Pid))
	return err == nil && slices.Contains(gs, g)
}

// start registers c and runs its loop; false if the agent is closed.
func (a *Agent) start(c *client) bool {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		c.teardownUnstarted()
		return false
	}
	a.clients[c.id] = c
	a.nclients.Add(1)
	a.wg.Add(1)
	a.mu.Unlock()
	a.watch.note()
	go func() {
		defer a.wg.Done()
		c.RoutineServe()
	}()
	return true
}

// addForkChild starts serving a forked child and keeps it for its HELLO.
func (a *Agent) addForkChild(ppid int, serial uint64, c *client) {
	if !a.start(c) {
		return
	}
	a.mu.Lock()
	a.forked[forkKey{ppid, serial}] = c
	a.cond.Broadcast()
	a.mu.Unlock()
}

// takeForkChild returns the child of fork serial of ppid, waiting until
// deadline for the parent's loop to have handled the FORK, if cred may be
// that child: the parent's user, and a child of the parent (childOf). The
// WELCOME hands it the child's uffd, with which it could write into the
// child's memory: any other process is refused, and the child stays for
// its own HELLO.
func (a *Agent) takeForkChild(ppid int, serial uint64, cred *unix.Ucred, deadline time.Time) *client {
	k := forkKey{ppid, serial}
	t := time.AfterFunc(time.Until(deadline), func() {
		a.mu.Lock()
		a.cond.Broadcast()
		a.mu.Unlock()
	})
	defer t.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if c := a.forked[k]; c != nil {
			if c.uid.Load() != cred.Uid || !childOf(int(cred.Pid), ppid) {
				return nil
			}
			delete(a.forked, k)
			return c
		}
		if a.closed || time.Now().After(deadline) {
			return nil
		}
		a.cond.Wait()
	}
}

// maxExited bounds how many exited clients' final stats Exited keeps.
const maxExited = 64

// dropClient forgets c (its loop has ended), keeping its final stats.
func (a *Agent) dropClient(c *client) {
	final := a.statsOf(c)
	final.Exited = true
	a.mu.Lock()
	if a.clients[c.id] == c {
		delete(a.clients, c.id)
		a.nclients.Add(-1)
		if len(a.exited) == maxExited {
			a.exited = append(a.exited[:0], a.exited[1:]...)
		}
		a.exited = append(a.exited, final)
		a.gone.addCounters(final)
	}
	for k, fc := range a.forked {
		if fc == c {
			delete(a.forked, k)
		}
	}
	a.mu.Unlock()
	a.watch.note()
}

// minLocalMem is the smallest budget a client may have (16 pages).
const minLocalMem = 16 * pageSize

// Stats returns a snapshot of every client, ordered by id.
func (a *Agent) Stats() []ClientStats {
	a.mu.Lock()
	cs := make([]*client, 0, len(a.clients))
	for _, c := range a.clients {
		cs = append(cs, c)
	}
	a.mu.Unlock()
	out := make([]ClientStats, 0, len(cs))
	for _, c := range cs {
		out = append(out, a.statsOf(c))
	}
	slices.SortFunc(out, func(x, y ClientStats) int { return int(x.ID) - int(y.ID) })
	return out
}

// Exited returns the final stats of the most recently exited clients
// (at most 64), oldest first.
func (a *Agent) Exited() []ClientStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.exited)
}

func (a *Agent) statsOf(c *client) ClientStats {
	s := c.st.snapshot(pageSize)
	s.ID, s.PID, s.UID, s.BudgetBytes = c.id, int(c.pidAtm.Load()), c.uid.Load(), uint64(c.budgetPages())*pageSize
	s.Auto = a.target(c) > 0 // steered from the next step (steer.go) on
	if s.Auto {
		s.StallPct = math.Round(100*math.Float64frombits(c.bud.stallFrac.Load())*1000) / 1000
	}
	return s
}

// teardownUnstarted releases a client whose loop never ran.
func (c *client) teardownUnstarted() {
	c.io.Close()
	c.uffd.Close()
	c.ev.release()
	unix.Close(c.wakefd)
	close(c.done)
}

// loopCount counts the client loops running; its mutex orders the
// Options.LoopsChanged calls.
type loopCount struct {
	mu sync.Mutex
	n  int
}

// loopsAdd counts a client loop that starts (+1) or ends (-1) and tells
// Options.LoopsChanged.
func (a *Agent) loopsAdd(d int) {
	a.loops.mu.Lock()
	defer a.loops.mu.Unlock()
	a.loops.n += d
	if a.opts.LoopsChanged != nil {
		a.opts.LoopsChanged(a.loops.n)
	}
}

// tracedBy reports whether process pid is traced by a thread of process
// tracer (TracerPid names the tracing thread).
func tracedBy(pid, tracer int) bool {
	t, err := procinfo.TracerPid(pid)
	if err != nil || t == 0 {
		return false
	}
	_, err = os.Stat(fmt.Sprintf("/proc/%d/task/%d", tracer, t))
	return err == nil
}
