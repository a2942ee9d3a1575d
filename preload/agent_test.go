package preload

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// testAgent is a test fixture, not the product (that is package pager): it
// speaks the protocol, serves faults with ZeroPage or Copy from an
// in-memory map of page contents, and evicts pages on request through the
// shim's helper thread. The memory it serves lives in other processes.
type testAgent struct {
	t    testing.TB
	path string
	ln   *net.UnixListener
	wg   sync.WaitGroup

	mu       sync.Mutex
	cond     *sync.Cond
	clients  map[int32]*agentClient
	forks    map[forkKey]*forkedChild // FORK events not yet claimed by a HELLO
	closed   bool
	hellos   int
	handoffs int                // HANDOFFs answered, on a client's connection or one of their own
	rings    int                // HELLOs that asked for the fault ring
	journal  map[int32]*journal // clients' evicted pages, as they ended (for a successor)
	from     *testAgent         // the agent this one succeeds: resuming HELLOs take its journal
	refuse   bool               // answer HELLO with ERROR
	badHello []byte             // answer HELLO with these bytes (no descriptors)

	eventDelay atomic.Int64 // ns the uffd reader sleeps after a FORK event, before the loop may look
	restoreWP  atomic.Bool  // restore evicted pages write-protected, as the pager does (to see them dirtied)
	// ns the ring reader polls a client's fault ring, once it is empty,
	// before it sleeps in poll(2) on the doorbell (ring mode).
	ringSpin atomic.Int64
	// resumeReply: a successor serves a resumed process this long before
	// it answers its RESUME_DONE (TestAgentRestartDoorbell): the shim
	// installs the new doorbell only once answered.
	resumeReply time.Duration
}

// journal is what an agent knows of a client's pages that the client
// does not: the contents of the pages it evicted.
type journal struct {
	saved map[userfaultfd.Addr][]byte
}

type forkKey struct {
	ppid   int32
	serial uint64
}

// forkedChild is what a FORK event leaves for the child's HELLO: its uffd
// and a copy of the parent's state at the fork.
type forkedChild struct {
	uffd     *userfaultfd.UFFD
	regions  []region
	saved    map[userfaultfd.Addr][]byte
	resident map[userfaultfd.Addr]bool
	key      forkKey
	// The eviction batch out when the FORK event came: the helper may
	// have dropped those pages before fork(2) copied the page tables, so
	// the child lacks them too. They come from the staging slots once the
	// batch's EVICTED arrives, and until then the child's HELLO waits.
	wait []userfaultfd.Addr
}

type region struct {
	id   uint64
	r    userfaultfd.Range
	kind proto.Kind
}

// agentStats are counts for one client.
type agentStats struct {
	Regions     map[proto.Kind]int // REGION_ADDs by kind
	Deletes     int
	ZeroFills   int
	Restores    int // faults served from evicted contents
	Evicted     int
	HeldFaults  int // faults on pages while their eviction was in flight
	RemoveEvts  int
	Zaps        int // REGION_ZAPs
	SharedZaps  int // REGION_ZAPs of a shared region's pages
	SharedDels  int // REGION_DELs of a shared region's pages
	UnmapEvts   int
	ForkEvents  int
	ForkChild   bool
	StagingSize int
	Features    userfaultfd.Feature // the uffd's, as HELLO said
	Ring        bool                // the client's faults come through its fault ring
	RingFaults  int                 // faults taken from the ring
	RingPosted  uint64              // the ring header's counts
	RingBells   uint64
	Pinned      int // victims the shim kept: pinned by a system call (EBUSY)
	Requeued    int // ring entries a previous agent was serving, taken back at a resume
}

type agentClient struct {
	a      *testAgent
	pid    int32
	ppid   int32
	conn   *net.UnixConn
	uffd   *userfaultfd.UFFD
	stopfd int // eventfd: stops the uffd reader
	memfd  int
	stage  []byte // the staging slots
	smap   []byte // the staging mapping: the slots, then the fault ring
	ring   agentRing
	bell   int // the doorbell eventfd, ring mode; -1
	// lateReply: the RESUME_DONE serve answers after a.resumeReply (0:
	// answered already).
	lateReply uint32
	done      chan struct{}
	cmds      chan evictCmd
	raw       chan rawCmd

	// Owned by the serve goroutine.
	regions  []region
	saved    map[userfaultfd.Addr][]byte
	resident map[userfaultfd.Addr]bool
	// Evicted pages whose REMOVE event (from the helper's MADV_DONTNEED)
	// has not been handled yet: the event is read before EVICTED is sent,
	// but the two readers may deliver them in either order.
	expectRemove map[userfaultfd.Addr]bool
	forks        uint64
	forkWait     []*forkedChild // copies waiting for the batch in flight
	// The uffd reader reads under readMu and counts the FORK events it
	// read in forksRead; the loop counts those it handled in forksDone.
	readMu    sync.Mutex
	forksRead uint64
	forksDone uint64
	readerEnd atomic.Pointer[string] // why the uffd reader returned, once it has (for claimFork's error)
	seq       uint32
	sbuf      []byte

	smu     sync.Mutex
	stats   agentStats
	regSnap []region // c.regions as of the last change, for Regions
}

type evictCmd struct {
	only  *userfaultfd.Range // evict pages in this range only; nil: all
	reply chan evictResult
}

// rawCmd sends pkt as it is; an EVICTED that answers it (batch
// rawBatch) goes to reply.
type rawCmd struct {
	pkt   []byte
	reply chan *proto.Evicted
}

const rawBatch = 1 << 40

// Inject sends pkt to pid's shim. If wantReply, it waits for the EVICTED
// answering an EVICT of batch rawBatch.
func (a *testAgent) Inject(pid int32, pkt []byte, wantReply bool) (*proto.Evicted, error) {
	c, err := a.client(pid)
	if err != nil {
		return nil, err
	}
	cmd := rawCmd{pkt: pkt}
	if wantReply {
		cmd.reply = make(chan *proto.Evicted, 1)
	}
	select {
	case c.raw <- cmd:
	case <-c.done:
		return nil, errors.New("client gone")
	}
	if !wantReply {
		return nil, nil
	}
	select {
	case m := <-cmd.reply:
		return m, nil
	case <-c.done:
		return nil, errors.New("client gone before EVICTED")
	case <-time.After(20 * time.Second):
		return nil, errors.New("no EVICTED")
	}
}

type evictResult struct {
	n   int
	err error
}

const testSlots = 64

func newTestAgent(t testing.TB) *testAgent {
	t.Helper()
	return startTestAgent(t, filepath.Join(t.TempDir(), "agent.sock"), nil)
}

// newSuccessor starts an agent at from's socket once from is closed: it
// takes from's clients back (resuming HELLOs) with their evicted pages.
func newSuccessor(t testing.TB, from *testAgent) *testAgent {
	t.Helper()
	return startTestAgent(t, from.path, from)
}

// newSuccessorWith is newSuccessor with set applied before it listens.
func newSuccessorWith(t testing.TB, from *testAgent, set func(*testAgent)) *testAgent {
	t.Helper()
	return startTestAgent(t, from.path, from, set)
}

func startTestAgent(t testing.TB, path string, from *testAgent, set ...func(*testAgent)) *testAgent {
	t.Helper()
	a := &testAgent{
		t:       t,
		path:    path,
		clients: map[int32]*agentClient{},
		forks:   map[forkKey]*forkedChild{},
		journal: map[int32]*journal{},
		from:    from,
	}
	a.cond = sync.NewCond(&a.mu)
	a.ringSpin.Store(int64(100 * time.Microsecond))
	for _, f := range set {
		f(a)
	}
	ln, err := proto.Listen(a.path)
	if err != nil {
		t.Fatal(err)
	}
	a.ln = ln
	a.wg.Add(1)
	go a.routineAccept()
	t.Cleanup(a.Close)
	return a
}

func (a *testAgent) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.cond.Broadcast()
	if ring := ringTest(a.t); a.hellos > 0 && (a.rings > 0) != ring {
		a.t.Errorf("agent: %d of %d HELLOs asked for the fault ring, in a test in ring mode: %v", a.rings, a.hellos, ring)
	}
	// The listener first: a shim whose connection closes connects again
	// at once with a resuming HELLO, which this agent does not take.
	a.ln.Close()
	for _, c := range a.clients {
		c.conn.Close()
	}
	for k, f := range a.forks {
		f.uffd.Close()
		delete(a.forks, k)
	}
	a.mu.Unlock()
	a.wg.Wait()
}

func (a *testAgent) routineAccept() {
	defer a.wg.Done()
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			return
		}
		a.wg.Add(1)
		go a.routineClient(c)
	}
}

// client waits for the client with pid to have said HELLO.
func (a *testAgent) client(pid int32) (*agentClient, error) {
	deadline := time.Now().Add(20 * time.Second)
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.clients[pid] == nil {
		if time.Now().After(deadline) || a.closed {
			return nil, fmt.Errorf("no HELLO from pid %d", pid)
		}
		a.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		a.mu.Lock()
	}
	return a.clients[pid], nil
}

// Evict evicts every page of pid that is resident, in batches of 64, and
// returns how many it evicted.
func (a *testAgent) Evict(pid int32) (int, error) { return a.evict(pid, nil) }

// EvictRange evicts the resident pages of pid in r only.
func (a *testAgent) EvictRange(pid int32, r userfaultfd.Range) (int, error) { return a.evict(pid, &r) }

func (a *testAgent) evict(pid int32, only *userfaultfd.Range) (int, error) {
	c, err := a.client(pid)
	if err != nil {
		return 0, err
	}
	cmd := evictCmd{only: only, reply: make(chan evictResult, 1)}
	select {
	case c.cmds <- cmd:
	case <-c.done:
		return 0, errors.New("client gone")
	}
	select {
	case r := <-cmd.reply:
		return r.n, r.err
	case <-c.done:
		return 0, errors.New("client gone during eviction")
	}
}

func (a *testAgent) Stats(pid int32) agentStats {
	c, err := a.client(pid)
	if err != nil {
		a.t.Errorf("stats: %v", err)
		return agentStats{}
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	s := c.stats
	s.Regions = maps(c.stats.Regions)
	return s
}

// Regions returns pid's regions as the agent has them.
func (a *testAgent) Regions(pid int32) []region {
	c, err := a.client(pid)
	if err != nil {
		a.t.Errorf("regions: %v", err)
		return nil
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	return slices.Clone(c.regSnap)
}

// publishRegions makes c.regions visible to Regions.
func (c *agentClient) publishRegions() {
	c.smu.Lock()
	c.regSnap = slices.Clone(c.regions)
	c.smu.Unlock()
}

func maps(m map[proto.Kind]int) map[proto.Kind]int {
	out := map[proto.Kind]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (a *testAgent) routineClient(conn *net.UnixConn) {
	defer a.wg.Done()
	defer conn.Close()
	buf, oob := make([]byte, proto.MaxPacket), make([]byte, proto.OOBSize)
	fds := make([]int, proto.MaxFDs)
	pkt, nfds, err := proto.Recv(conn, buf, oob, fds)
	if err != nil {
		a.t.Errorf("agent: first packet: %v", err)
		return
	}
	// A shim that may not make a uffd with FORK events (no
	// CAP_SYS_PTRACE) asks for /dev/userfaultfd first: this agent lends
	// none, and the shim makes one without them.
	if hdr, m, err := proto.Decode(pkt); err == nil {
		if ho, ok := m.(*proto.Handoff); ok {
			// A child about to exec (or one not connected passing
			// descriptors) says so on a connection of its own: this
			// agent pages no shared memory, and answers ACK.
			closeFDs(fds[:nfds])
			if cred, err := userfaultfd.PeerCred(conn); err != nil || cred.Pid != ho.PID {
				a.t.Errorf("agent: HANDOFF of pid %d, peer %v %v", ho.PID, cred, err)
			}
			a.mu.Lock()
			a.handoffs++
			a.mu.Unlock()
			if err := proto.Send(conn, make([]byte, 0, proto.MaxPacket), 0, &proto.Ack{Seq: hdr.Seq}); err != nil {
				a.t.Errorf("agent: HANDOFF: %v", err)
			}
			return
		}
		if _, ok := m.(*proto.UFFDDevice); ok {
			closeFDs(fds[:nfds])
			sbuf := make([]byte, 0, proto.MaxPacket)
			if err := proto.Send(conn, sbuf, 0, &proto.Error{Seq: hdr.Seq, Errno: unix.EPERM, Text: "test agent lends none"}); err != nil {
				a.t.Errorf("agent: UFFD_DEVICE: %v", err)
				return
			}
			if pkt, nfds, err = proto.Recv(conn, buf, oob, fds); err != nil {
				a.t.Errorf("agent: HELLO after UFFD_DEVICE: %v", err)
				return
			}
		}
	}
	var h proto.Hello
	hdr, err := proto.Expect(pkt, &h)
	if err != nil {
		a.t.Errorf("agent: HELLO: %v", err)
		closeFDs(fds[:nfds])
		return
	}
	if h.Flags&proto.HelloResume != 0 {
		a.routineResume(conn, h, fds[:nfds])
		return
	}
	cred, err := userfaultfd.PeerCred(conn)
	if err != nil || cred.Pid != h.PID {
		a.t.Errorf("agent: HELLO pid %d, peer %v %v", h.PID, cred, err)
	}
	c := a.newClient(conn, &h)
	defer close(c.done)
	a.mu.Lock()
	a.hellos++
	if c.stats.Ring {
		a.rings++
	}
	refuse, bad := a.refuse, a.badHello
	a.mu.Unlock()
	if bad != nil {
		closeFDs(fds[:nfds])
		conn.Write(bad)
		// Wait for the shim to hang up.
		conn.Read(make([]byte, proto.MaxPacket))
		return
	}
	if refuse {
		closeFDs(fds[:nfds])
		proto.Send(conn, c.sbuf, 0, &proto.Error{Seq: hdr.Seq, Errno: unix.EPERM, Text: "test agent refuses"})
		return
	}
	if h.ForkSerial == 0 {
		if nfds != 1 {
			a.t.Errorf("agent: top-level HELLO with %d fds", nfds)
			closeFDs(fds[:nfds])
			return
		}
		c.uffd, err = userfaultfd.FromFD(fds[0], h.Features)
		if err != nil {
			a.t.Errorf("agent: %v", err)
			return
		}
	} else {
		closeFDs(fds[:nfds])
		f, err := a.claimFork(forkKey{h.PPID, h.ForkSerial})
		if err != nil {
			a.t.Errorf("agent: HELLO of pid %d: %v", h.PID, err)
			proto.Send(conn, c.sbuf, 0, &proto.Error{Seq: hdr.Seq, Errno: unix.ESRCH, Text: err.Error()})
			return
		}
		c.uffd, c.regions, c.saved, c.resident = f.uffd, f.regions, f.saved, f.resident
		c.stats.ForkChild = true
		c.publishRegions()
	}
	defer c.uffd.Close()
	if err := c.setupStaging(c.stats.Ring); err != nil {
		a.t.Errorf("agent: %v", err)
		return
	}
	defer unix.Munmap(c.smap)
	defer unix.Close(c.memfd)
	if c.bell >= 0 {
		defer unix.Close(c.bell)
	}
	w := &proto.Welcome{ClientID: uint64(h.PID), StagingSlots: testSlots}
	wfds := []int{c.memfd}
	if h.ForkSerial != 0 {
		w.Flags |= proto.WelcomeUFFD
		wfds = append(wfds, c.uffd.Fd())
	}
	if c.bell >= 0 {
		w.Flags |= proto.WelcomeRing
		wfds = append(wfds, c.bell)
	}
	if err := proto.Send(conn, c.sbuf, 0, w, wfds...); err != nil {
		a.t.Errorf("agent: WELCOME: %v", err)
		return
	}
	a.serveClient(h.PID, c)
}

// serveClient registers c as pid's client, serves it until it ends or the
// agent closes, and keeps its journal.
func (a *testAgent) serveClient(pid int32, c *agentClient) {
	var err error
	if c.stopfd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		a.t.Errorf("agent: %v", err)
		return
	}
	defer unix.Close(c.stopfd)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.clients[pid] = c
	a.mu.Unlock()
	c.serve()
	a.keepJournal(c)
}

// keepJournal records what c's pages were as it ended, for a successor.
func (a *testAgent) keepJournal(c *agentClient) {
	a.mu.Lock()
	a.journal[c.pid] = &journal{saved: c.saved}
	a.mu.Unlock()
}

// newClient is a client of pid before its staging area and uffd.
func (a *testAgent) newClient(conn *net.UnixConn, h *proto.Hello) *agentClient {
	c := &agentClient{
		a: a, pid: h.PID, ppid: h.PPID, conn: conn, memfd: -1, bell: -1,
		done: make(chan struct{}), cmds: make(chan evictCmd), raw: make(chan rawCmd),
		saved: map[userfaultfd.Addr][]byte{}, resident: map[userfaultfd.Addr]bool{},
		expectRemove: map[userfaultfd.Addr]bool{},
		sbuf:         make([]byte, 0, proto.MaxPacket),
	}
	c.stats.Regions = map[proto.Kind]int{}
	c.stats.Features = h.Features
	c.stats.Ring = h.Flags&proto.HelloRing != 0
	return c
}

// routineResume takes back a client whose agent went away: a resuming
// HELLO brings its uffd and staging memfd (with its fault ring), then its
// regions again and RESUME_DONE. Its evicted pages come from the journal
// of the agent this one succeeds. The faults the dead agent had taken come
// again: in ring mode the entries it was serving are posted again (their
// threads still wait on them); otherwise each region is woken (a thread
// waiting in the kernel retries its access, and faults to us).
func (a *testAgent) routineResume(conn *net.UnixConn, h proto.Hello, fds []int) {
	c := a.newClient(conn, &h)
	defer close(c.done)
	a.mu.Lock()
	a.hellos++
	if c.stats.Ring {
		a.rings++
	}
	var j *journal
	if a.from != nil {
		a.from.mu.Lock()
		j = a.from.journal[h.PID]
		a.from.mu.Unlock()
	}
	a.mu.Unlock()
	if len(fds) != 2 {
		a.t.Errorf("agent: resuming HELLO with %d fds", len(fds))
		closeFDs(fds)
		return
	}
	var err error
	if c.uffd, err = userfaultfd.FromFD(fds[0], h.Features); err != nil {
		a.t.Errorf("agent: %v", err)
		closeFDs(fds[1:])
		return
	}
	defer c.uffd.Close()
	c.memfd = fds[1]
	defer unix.Close(c.memfd)
	ps := int(userfaultfd.PageSize)
	size := testSlots * ps
	if c.stats.Ring {
		size += proto.RingSize
	}
	if c.smap, err = unix.Mmap(c.memfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		a.t.Errorf("agent: map the staging memfd: %v", err)
		return
	}
	defer unix.Munmap(c.smap)
	c.stage = c.smap[:testSlots*ps]
	w := &proto.Welcome{ClientID: uint64(h.PID), StagingSlots: testSlots}
	var wfds []int
	if c.stats.Ring {
		if c.bell, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			a.t.Errorf("agent: %v", err)
			return
		}
		defer unix.Close(c.bell)
		c.ring = agentRing{c.smap[testSlots*ps:]}
		c.ring.init()
		w.Flags |= proto.WelcomeRing
		wfds = append(wfds, c.bell)
	}
	if j != nil {
		w.Flags |= proto.WelcomeResumed
		c.saved = j.saved
	}
	if err := proto.Send(conn, c.sbuf, 0, w, wfds...); err != nil {
		a.t.Errorf("agent: WELCOME: %v", err)
		return
	}
	buf, oob := make([]byte, proto.MaxPacket), make([]byte, proto.OOBSize)
	for {
		pkt, _, err := proto.Recv(conn, buf, oob, nil)
		if err != nil {
			a.t.Errorf("agent: resume of pid %d: %v", h.PID, err)
			return
		}
		hdr, m, err := proto.Decode(pkt)
		if err != nil {
			a.t.Errorf("agent: resume of pid %d: %v", h.PID, err)
			return
		}
		if add, ok := m.(*proto.RegionAdd); ok {
			c.regions = append(c.regions, region{add.ID, add.Range, add.Kind})
			continue
		}
		if _, ok := m.(*proto.ResumeDone); !ok {
			a.t.Errorf("agent: resume of pid %d: %v before RESUME_DONE", h.PID, hdr.Type)
			return
		}
		if a.resumeReply > 0 {
			c.lateReply = hdr.Seq // (answered by serve, after a.resumeReply)
		} else {
			c.reply(hdr.Seq, nil)
		}
		break
	}
	c.publishRegions()
	if c.stats.Ring {
		c.smu.Lock()
		c.stats.Requeued = c.ring.requeue()
		c.smu.Unlock()
	} else {
		for _, r := range c.regions {
			c.uffd.Wake(r.r)
		}
	}
	a.serveClient(h.PID, c)
}

func (a *testAgent) claimFork(k forkKey) (*forkedChild, error) {
	deadline := time.Now().Add(10 * time.Second)
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.forks[k] == nil {
		if a.closed || time.Now().After(deadline) {
			why := "parent not a client"
			if p := a.clients[k.ppid]; p != nil {
				p.readMu.Lock()
				read := p.forksRead
				p.readMu.Unlock()
				why = fmt.Sprintf("parent's uffd reader read %d FORK events", read)
				if e := p.readerEnd.Load(); e != nil {
					why += ", then returned (" + *e + ")"
				}
			}
			return nil, fmt.Errorf("no FORK event for parent %d serial %d (%s)", k.ppid, k.serial, why)
		}
		a.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		a.mu.Lock()
	}
	f := a.forks[k]
	delete(a.forks, k)
	return f, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// setupStaging makes the client's staging memfd, with the fault ring after
// the slots (its header written) and the doorbell when ring.
func (c *agentClient) setupStaging(ring bool) error {
	fd, err := unix.MemfdCreate("rmem-test-staging", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	slots := testSlots * int(userfaultfd.PageSize)
	size := slots
	if ring {
		size += proto.RingSize
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return err
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return err
	}
	if ring {
		if c.bell, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			unix.Munmap(b)
			unix.Close(fd)
			return err
		}
		c.ring = agentRing{b[slots:]}
		c.ring.init()
	}
	c.memfd, c.smap, c.stage = fd, b, b[:slots]
	c.stats.StagingSize = slots
	return nil
}

type sockMsg struct {
	h   proto.Header
	m   proto.Message
	err error
}

// serve is the client's loop: one goroutine owns its state; two readers
// feed it the socket's messages and the uffd's events.
//
// Order between the two: a uffd event the kernel considers read may be
// followed by a message the client sends once it is (fork returns in the
// parent when its FORK event is read; the parent then unmaps a region whose
// REGION_DEL must come after the FORK copied the regions for the child).
// readSeq counts the event batches the uffd reader has read, handled those
// the loop has handled: before a socket message, the loop handles the
// batches read so far. The reader reads and counts under readMu, and the
// loop takes readMu to look at the count: a read the kernel has done is
// counted by then. (Counted after the read, without the lock, the loop
// could take a REGION_DEL the parent sent right after fork() returned
// before the FORK event, whose reader had not counted it yet: the child's
// copy of the regions then lacked the region, and the child's own
// REGION_DEL of it was "of unknown region" (TestAtforkHandlersAllocate,
// once, under GOMAXPROCS=1 on a busy machine; TestForkThenUnmap makes the
// reader that slow).)
func (c *agentClient) serve() {
	msgs := make(chan sockMsg)
	events := make(chan []userfaultfd.Event)
	quit := make(chan struct{})
	var readSeq atomic.Uint64
	readMu := &c.readMu
	handled := uint64(0)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // socket reader
		defer wg.Done()
		buf, oob := make([]byte, proto.MaxPacket), make([]byte, proto.OOBSize)
		for {
			pkt, _, err := proto.Recv(c.conn, buf, oob, nil)
			var sm sockMsg
			if err != nil {
				sm.err = err
			} else {
				sm.h, sm.m, sm.err = proto.Decode(pkt)
			}
			select {
			case msgs <- sm:
			case <-quit:
				return
			}
			if sm.err != nil {
				return
			}
		}
	}()
	go func() { // uffd reader
		defer wg.Done()
		end := "stopped"
		defer func() { c.readerEnd.Store(&end) }()
		raw := make([]userfaultfd.Msg, 64)
		// For 50 µs after a read it polls the uffd without blocking
		// (yielding to the loop at each look): the next fault of a thread
		// the loop just served comes within microseconds, and a poll(2)
		// that slept cost a wake-up each (~75 µs a first touch; the
		// allocator tests took 16 s instead of 4).
		var spinUntil time.Time
		for {
			if time.Now().After(spinUntil) {
				fds := []unix.PollFd{{Fd: int32(c.uffd.Fd()), Events: unix.POLLIN}, {Fd: int32(c.stopfd), Events: unix.POLLIN}}
				if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
					c.a.t.Errorf("agent: poll: %v", err)
					return
				}
				if fds[1].Revents != 0 || fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
					end = fmt.Sprintf("poll: stop %#x, uffd %#x", fds[1].Revents, fds[0].Revents)
					return
				}
			} else {
				runtime.Gosched()
			}
			readMu.Lock()
			n, err := c.uffd.ReadEvents(raw)
			evs := make([]userfaultfd.Event, 0, n)
			for i := range n {
				ev, err := raw[i].Decode()
				if err != nil {
					c.a.t.Errorf("agent: %v", err)
					continue
				}
				evs = append(evs, ev)
				if ev.Kind == userfaultfd.EventFork {
					c.forksRead++
				}
				if d := c.a.eventDelay.Load(); d > 0 && ev.Kind == userfaultfd.EventFork {
					time.Sleep(time.Duration(d)) // a reader slow to publish a FORK (TestForkThenUnmap)
				}
			}
			if err == nil && n > 0 {
				readSeq.Add(1)
			}
			readMu.Unlock()
			if err == unix.EAGAIN || (err == nil && n == 0) {
				continue
			}
			if err != nil {
				end = "read: " + err.Error()
				return
			}
			spinUntil = time.Now().Add(50 * time.Microsecond)
			select {
			case events <- evs:
			case <-quit:
				for _, ev := range evs {
					if ev.Kind == userfaultfd.EventFork {
						unix.Close(ev.FD)
					}
				}
				return
			}
		}
	}()
	rings := make(chan []ringFault)
	if c.bell >= 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.routineRing(rings, quit)
		}()
	}
	defer func() {
		for _, f := range c.forkWait {
			f.uffd.Close()
		}
		close(quit)
		unix.Write(c.stopfd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		c.conn.Close()
		wg.Wait()
	}()

	var ev *eviction
	var retry []userfaultfd.Event
	var rretry []ringFault
	var rawReply chan *proto.Evicted
	var late <-chan time.Time
	if c.lateReply != 0 {
		late = time.After(c.a.resumeReply)
	}
	// handleRead handles the events the uffd reader has read and not yet
	// handed over: those come before any message read after them.
	handleRead := func() {
		readMu.Lock()
		read := readSeq.Load()
		readMu.Unlock()
		for handled < read {
			evs := <-events
			handled++
			for _, e := range evs {
				if c.handleEvent(e, ev) {
					retry = append(retry, e)
				}
			}
		}
	}
	for {
		var tick <-chan time.Time
		if len(retry) > 0 || len(rretry) > 0 {
			tick = time.After(200 * time.Microsecond)
		}
		select {
		case <-late:
			c.reply(c.lateReply, nil)
			late = nil
		case <-tick:
			again := retry[:0:0]
			for _, e := range retry {
				if c.handleEvent(e, ev) {
					again = append(again, e)
				}
			}
			retry = again
			ragain := rretry[:0:0]
			for _, f := range rretry {
				if c.handleRing(f, ev) {
					ragain = append(ragain, f)
				}
			}
			rretry = ragain
		case rf := <-rings:
			for _, f := range rf {
				if c.handleRing(f, ev) {
					rretry = append(rretry, f)
				}
			}
			posted, bells := c.ring.counts()
			c.smu.Lock()
			c.stats.RingFaults += len(rf)
			c.stats.RingPosted, c.stats.RingBells = posted, bells
			c.smu.Unlock()
		case sm := <-msgs:
			if sm.err != nil {
				// ECONNRESET: the process exited with packets of ours
				// unread (an EVICT in flight), as the pager allows too.
				if !errors.Is(sm.err, io.EOF) && !errors.Is(sm.err, net.ErrClosed) && !errors.Is(sm.err, unix.ECONNRESET) {
					c.a.t.Errorf("agent: pid %d: %v", c.pid, sm.err)
				}
				if ev != nil {
					ev.cmd.reply <- evictResult{ev.total, errors.New("client gone")}
				}
				// The events read before the process went: a FORK among
				// them names a child that says HELLO next (daemon(3)
				// forks, and the parent exits at once).
				handleRead()
				return
			}
			handleRead()
			if m, ok := sm.m.(*proto.Evicted); ok && m.Batch == rawBatch && rawReply != nil {
				rawReply <- m
				rawReply = nil
				continue
			}
			ev = c.handleMsg(sm, ev)
		case evs := <-events:
			handled++
			for _, e := range evs {
				if c.handleEvent(e, ev) {
					retry = append(retry, e)
				}
			}
		case r := <-c.raw:
			if _, err := c.conn.Write(r.pkt); err != nil {
				c.a.t.Errorf("agent: inject: %v", err)
			}
			if r.reply != nil {
				rawReply = r.reply
			}
		case cmd := <-c.cmds:
			if ev != nil {
				cmd.reply <- evictResult{0, errors.New("eviction in flight")}
				continue
			}
			ev = c.startEviction(cmd)
		}
	}
}

// eviction is an EVICT in flight.
type eviction struct {
	cmd     evictCmd
	pending []userfaultfd.Addr // pages still to evict, sorted
	batch   []userfaultfd.Addr // the batch out now
	id      uint64
	held    []userfaultfd.Addr        // faults on batch pages, woken after EVICTED
	heldR   []int                     // the same, from the fault ring: their entries
	removed map[userfaultfd.Addr]bool // batch pages whose REMOVE came already
	total   int
}

func (e *eviction) inBatch(a userfaultfd.Addr) bool {
	if e == nil {
		return false
	}
	_, ok := slices.BinarySearch(e.batch, a)
	return ok
}

func (c *agentClient) reply(seq uint32, err error) {
	var m proto.Message = &proto.Ack{Seq: seq}
	if err != nil {
		m = &proto.Error{Seq: seq, Errno: unix.EINVAL, Text: err.Error()}
	}
	c.seq++
	if err := proto.Send(c.conn, c.sbuf, c.seq, m); err != nil {
		c.a.t.Errorf("agent: reply: %v", err)
	}
}

func (c *agentClient) handleMsg(sm sockMsg, ev *eviction) *eviction {
	switch m := sm.m.(type) {
	case *proto.RegionAdd:
		for _, r := range c.regions {
			if r.r.Overlaps(m.Range) {
				c.a.t.Errorf("agent: REGION_ADD %v overlaps region %d %v", m.Range, r.id, r.r)
			}
		}
		c.forget(m.Range) // nothing of an earlier region at these addresses holds
		c.regions = append(c.regions, region{m.ID, m.Range, m.Kind})
		c.publishRegions()
		c.smu.Lock()
		c.stats.Regions[m.Kind]++
		c.smu.Unlock()
		c.reply(sm.h.Seq, nil)
	case *proto.RegionDel:
		var out []region
		found := false
		if c.isShared(m.ID) {
			c.smu.Lock()
			c.stats.SharedDels++
			c.smu.Unlock()
		}
		for _, r := range c.regions {
			if !r.r.Overlaps(m.Range) {
				out = append(out, r)
				continue
			}
			found = found || r.id == m.ID
			end, _ := r.r.End()
			dend, _ := m.Range.End()
			if r.r.Start < m.Range.Start {
				out = append(out, region{r.id, userfaultfd.Range{Start: r.r.Start, Len: uint64(m.Range.Start - r.r.Start)}, r.kind})
			}
			if dend < end {
				out = append(out, region{r.id, userfaultfd.Range{Start: dend, Len: uint64(end - dend)}, r.kind})
			}
		}
		if !found {
			c.a.t.Errorf("agent: REGION_DEL of unknown region %d %v", m.ID, m.Range)
		}
		c.regions = out
		c.publishRegions()
		c.forget(m.Range)
		c.smu.Lock()
		c.stats.Deletes++
		c.smu.Unlock()
		c.reply(sm.h.Seq, nil)
	case *proto.RegionZap:
		// The program drops these pages (madvise after our ACK): they
		// read as zeros from now on.
		c.forget(m.Range)
		c.smu.Lock()
		c.stats.Zaps++
		if c.isShared(m.ID) {
			c.stats.SharedZaps++
		}
		c.smu.Unlock()
		c.reply(sm.h.Seq, nil)
	case *proto.Handoff:
		c.a.mu.Lock()
		c.a.handoffs++
		c.a.mu.Unlock()
		c.reply(sm.h.Seq, nil)
	case *proto.Evicted:
		return c.finishBatch(m, ev)
	default:
		c.a.t.Errorf("agent: unexpected %v from pid %d", sm.h.Type, c.pid)
	}
	return ev
}

func (c *agentClient) forget(r userfaultfd.Range) {
	for p := range r.Pages(userfaultfd.PageSize) {
		delete(c.saved, p)
		delete(c.resident, p)
	}
}

// isShared reports whether region id is of kind shared.
func (c *agentClient) isShared(id uint64) bool {
	for _, r := range c.regions {
		if r.id == id {
			return r.kind == proto.KindShared
		}
	}
	return false
}

// inShared reports whether a lies in a region of kind shared: its pages
// are the segment's, which the agent never evicts through the process
// (the pager pages them once per segment; this fixture not at all).
func (c *agentClient) inShared(a userfaultfd.Addr) bool {
	for _, r := range c.regions {
		if r.kind == proto.KindShared && r.r.Contains(a) {
			return true
		}
	}
	return false
}

func (c *agentClient) inRegion(a userfaultfd.Addr) bool {
	for _, r := range c.regions {
		if r.r.Contains(a) {
			return true
		}
	}
	return false
}

// handleEvent handles one uffd event; it returns true if the event must be
// handled again later (the address space is changing).
func (c *agentClient) handleEvent(e userfaultfd.Event, ev *eviction) (again bool) {
	page := userfaultfd.Range{Start: e.Addr.RoundDown(userfaultfd.PageSize), Len: userfaultfd.PageSize}
	switch e.Kind {
	case userfaultfd.EventPagefault:
		if ev.inBatch(page.Start) {
			ev.held = append(ev.held, page.Start)
			c.smu.Lock()
			c.stats.HeldFaults++
			c.smu.Unlock()
			return false
		}
		if e.Flags&userfaultfd.FaultWP != 0 {
			err := c.uffd.Unprotect(page, 0)
			if userfaultfd.IsMMChanged(err) {
				return true
			}
			if err != nil {
				c.a.t.Errorf("agent: unprotect %v: %v", page, err)
			}
			return false
		}
		if !c.inRegion(page.Start) {
			c.a.t.Errorf("agent: pid %d faults at %v outside its regions", c.pid, e.Addr)
		}
		again, err := c.install(page)
		if again {
			return true
		}
		if err != nil && !userfaultfd.IsGone(err) {
			c.a.t.Errorf("agent: serve %v: %v", page, err)
		}
	case userfaultfd.EventRemove, userfaultfd.EventUnmap:
		c.smu.Lock()
		if e.Kind == userfaultfd.EventRemove {
			c.stats.RemoveEvts++
		} else {
			c.stats.UnmapEvts++
		}
		c.smu.Unlock()
		for p := range e.Range.Pages(userfaultfd.PageSize) {
			if e.Kind == userfaultfd.EventRemove && ev.inBatch(p) {
				ev.removed[p] = true
				continue // our own eviction's MADV_DONTNEED
			}
			if e.Kind == userfaultfd.EventRemove && c.expectRemove[p] {
				delete(c.expectRemove, p)
				continue // the same, handled after its EVICTED
			}
			delete(c.expectRemove, p)
			delete(c.saved, p)
			delete(c.resident, p)
		}
	case userfaultfd.EventFork:
		c.forksDone++ // installs may go on once every FORK read is handled
		child, err := userfaultfd.FromFD(e.FD, c.uffd.Features())
		if err != nil {
			c.a.t.Errorf("agent: %v", err)
			unix.Close(e.FD)
			return false
		}
		c.forks++
		f := &forkedChild{
			uffd:     child,
			regions:  slices.Clone(c.regions),
			saved:    map[userfaultfd.Addr][]byte{},
			resident: map[userfaultfd.Addr]bool{},
		}
		for k, v := range c.saved {
			f.saved[k] = slices.Clone(v)
		}
		for k := range c.resident {
			f.resident[k] = true
		}
		f.key = forkKey{c.pid, c.forks}
		c.smu.Lock()
		c.stats.ForkEvents++
		c.smu.Unlock()
		if ev != nil && len(ev.batch) > 0 {
			f.wait = slices.Clone(ev.batch)
			c.forkWait = append(c.forkWait, f)
		} else {
			c.publishFork(f)
		}
	default:
		c.a.t.Errorf("agent: unexpected event %v", e.Kind)
	}
	return false
}

// install maps the missing page: its evicted contents, or zeros. again:
// the address space is changing (a FORK read but not handled, an event
// being delivered): later.
func (c *agentClient) install(page userfaultfd.Range) (again bool, err error) {
	again, _, err = c.installed(page)
	return again, err
}

// installed is install, and says whether the page was there already
// (EEXIST: a resumed client's resident pages are not known).
func (c *agentClient) installed(page userfaultfd.Range) (again, exists bool, err error) {
	data, restore := c.saved[page.Start]
	// Not while a FORK read is not handled: reading it ended the
	// kernel's refusal, but the child's page tables were copied
	// without this page, and its copy of saved, made when the FORK
	// is handled, would lack it (the child would read zeros). The
	// kernel hands out faults before events: a FORK read with this
	// fault, or after it, may be unhandled yet. readMu keeps the
	// reader from reading one during the install.
	c.readMu.Lock()
	if c.forksRead > c.forksDone {
		c.readMu.Unlock()
		return true, false, nil
	}
	// The counts are taken with the install, under smu: the install
	// wakes the thread, and the program may have ended (the test
	// reading the counts) before this goroutine runs again.
	c.smu.Lock()
	if restore {
		var flags userfaultfd.Flags
		if c.a.restoreWP.Load() {
			flags = userfaultfd.WriteProtected
		}
		_, err = c.uffd.Copy(page.Start, data, flags)
	} else {
		_, err = c.uffd.ZeroPage(page, 0)
	}
	c.readMu.Unlock()
	if userfaultfd.IsMMChanged(err) {
		// A non-cooperative event (REMOVE, UNMAP, FORK) is being
		// delivered; once the reader has taken it, this succeeds.
		c.smu.Unlock()
		return true, false, nil
	}
	if restore && err == nil {
		delete(c.saved, page.Start)
		c.stats.Restores++
	} else if err == nil {
		c.stats.ZeroFills++
	}
	c.smu.Unlock()
	if exists = userfaultfd.IsExist(err); exists {
		err = c.uffd.Wake(page)
	}
	if err == nil {
		// Not when the range is gone (deleted while the fault
		// waited): a stale entry would later have a page of a new
		// region at that address evicted while it is not mapped,
		// and the shim's helper fault on it, holding its table lock.
		c.resident[page.Start] = true
	}
	return false, exists, err
}

// handleRing serves a fault taken from the fault ring as handleEvent
// serves one read from the uffd, and answers it; it returns true if it
// must be handled again later (the address space is changing). A write
// to a resident page is a write to a page held write-protected (restored
// so, or a victim not evicted): unprotected.
func (c *agentClient) handleRing(f ringFault, ev *eviction) (again bool) {
	page := userfaultfd.Range{Start: f.addr.RoundDown(userfaultfd.PageSize), Len: userfaultfd.PageSize}
	if !c.inRegion(page.Start) {
		c.ring.complete(f.idx, proto.RingNotMine)
		return false
	}
	if ev.inBatch(page.Start) {
		ev.heldR = append(ev.heldR, f.idx)
		c.smu.Lock()
		c.stats.HeldFaults++
		c.smu.Unlock()
		return false
	}
	var err error
	exists := c.resident[page.Start]
	if !exists {
		again, exists, err = c.installed(page)
	}
	if exists && f.write && err == nil {
		err = c.uffd.Unprotect(page, 0)
	}
	if again || userfaultfd.IsMMChanged(err) {
		return true
	}
	if err != nil && !userfaultfd.IsGone(err) {
		c.a.t.Errorf("agent: serve %v from the ring: %v", page, err)
	}
	c.ring.complete(f.idx, proto.RingDone)
	return false
}

// routineRing reads the client's fault ring (ring.go): it hands the loop
// the entries posted, polls the ring for ringSpin once it is empty, then
// says it sleeps (RingAsleep), looks once more, and sleeps in poll(2) on
// the doorbell until a post rings it.
func (c *agentClient) routineRing(out chan<- []ringFault, quit <-chan struct{}) {
	var batch []ringFault
	idle := time.Now()
	for {
		batch = c.ring.take(batch[:0])
		if len(batch) == 0 && time.Since(idle) >= time.Duration(c.a.ringSpin.Load()) {
			c.ring.setAgent(proto.RingAsleep)
			if batch = c.ring.take(batch[:0]); len(batch) == 0 {
				fds := []unix.PollFd{{Fd: int32(c.bell), Events: unix.POLLIN}, {Fd: int32(c.stopfd), Events: unix.POLLIN}}
				if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
					c.a.t.Errorf("agent: poll the doorbell: %v", err)
					return
				}
				if fds[1].Revents != 0 {
					return
				}
				var b [8]byte
				unix.Read(c.bell, b[:])
			}
			c.ring.setAgent(proto.RingAwake)
			idle = time.Now()
		}
		if len(batch) == 0 {
			select {
			case <-quit:
				return
			default:
			}
			// Polling, it lets the loop run: with one P (GOMAXPROCS=1)
			// a goroutine that spun here held the loop, and the thread it
			// served, off until preempted (~10 ms a fault).
			runtime.Gosched()
			continue
		}
		select {
		case out <- slices.Clone(batch):
		case <-quit:
			return
		}
		idle = time.Now()
	}
}

// publishFork leaves f for the child's HELLO.
func (c *agentClient) publishFork(f *forkedChild) {
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	if c.a.closed {
		f.uffd.Close()
		return
	}
	c.a.forks[f.key] = f
}

func (c *agentClient) startEviction(cmd evictCmd) *eviction {
	ev := &eviction{cmd: cmd, removed: map[userfaultfd.Addr]bool{}}
	for p := range c.resident {
		if cmd.only == nil || cmd.only.Contains(p) {
			ev.pending = append(ev.pending, p)
		}
	}
	slices.Sort(ev.pending)
	return c.nextBatch(ev)
}

func (c *agentClient) nextBatch(ev *eviction) *eviction {
	for len(ev.pending) > 0 {
		var m proto.Evict
		ev.batch = ev.batch[:0]
		for len(ev.pending) > 0 && m.N < testSlots {
			p := ev.pending[0]
			ev.pending = ev.pending[1:]
			if !c.inRegion(p) || !c.resident[p] || c.inShared(p) {
				// Its region was deleted since the eviction started (the
				// shim unmaps after our ACK, and refuses an EVICT of
				// memory no longer in its table with EFAULT), or its page
				// was dropped (REGION_ZAP: the allocator purged it), or
				// it is a shared region's (never evicted: the shim
				// refuses it, EFAULT).
				continue
			}
			var err error
			if !c.stats.Ring { // (in ring mode the helper protects them, after its pins: pager/evict.go)
				err = c.uffd.WriteProtect(userfaultfd.Range{Start: p, Len: userfaultfd.PageSize})
			}
			if userfaultfd.IsMMChanged(err) || userfaultfd.IsGone(err) {
				continue // the address space is changing (an unmap in flight): skip the page
			}
			if err != nil {
				c.a.t.Errorf("agent: write-protect %v: %v", p, err)
				continue
			}
			m.Pages[m.N] = proto.EvictPage{Addr: p, Slot: uint32(m.N)}
			ev.batch = append(ev.batch, p)
			m.N++
		}
		if m.N == 0 {
			continue
		}
		ev.id++
		m.Batch = ev.id
		c.seq++
		if err := proto.Send(c.conn, c.sbuf, c.seq, &m); err != nil {
			ev.cmd.reply <- evictResult{ev.total, err}
			return nil
		}
		return ev
	}
	ev.cmd.reply <- evictResult{ev.total, nil}
	return nil
}

func (c *agentClient) finishBatch(m *proto.Evicted, ev *eviction) *eviction {
	if ev == nil || m.Batch != ev.id {
		c.a.t.Errorf("agent: EVICTED %d without that batch out", m.Batch)
		return ev
	}
	pinned := int(m.Done) < len(ev.batch) && m.Errno == unix.EBUSY && c.stats.Ring
	if int(m.Done) != len(ev.batch) && !(m.Errno == unix.EFAULT && !c.inRegion(ev.batch[m.Done])) && !pinned {
		// (EFAULT for a page whose region was deleted while the batch
		// was out is the shim refusing memory it no longer has: right.
		// EBUSY in ring mode: a system call has that page pinned.)
		c.a.t.Errorf("agent: EVICTED %d of %d pages: %v", m.Done, len(ev.batch), m.Errno)
	}
	if pinned { // the pages after the pinned one: in the next batch
		c.smu.Lock()
		c.stats.Pinned++
		c.smu.Unlock()
		ev.pending = append(slices.Clone(ev.batch[m.Done+1:]), ev.pending...)
	}
	ps := int(userfaultfd.PageSize)
	for i, p := range ev.batch[:m.Done] {
		if !c.inRegion(p) {
			continue // deleted while the batch was out
		}
		c.saved[p] = slices.Clone(c.stage[i*ps : (i+1)*ps])
		delete(c.resident, p)
		if !ev.removed[p] {
			c.expectRemove[p] = true
		}
		ev.total++
	}
	c.smu.Lock()
	c.stats.Evicted += int(m.Done)
	c.smu.Unlock()
	for _, f := range c.forkWait {
		for i, p := range ev.batch[:m.Done] {
			if slices.Contains(f.wait, p) {
				f.saved[p] = slices.Clone(c.stage[i*ps : (i+1)*ps])
				delete(f.resident, p)
			}
		}
		c.publishFork(f)
	}
	c.forkWait = nil
	for _, p := range ev.batch[m.Done:] {
		// Not evicted: let writers through again.
		c.uffd.Unprotect(userfaultfd.Range{Start: p, Len: userfaultfd.PageSize}, 0)
	}
	for _, p := range ev.held {
		c.uffd.Wake(userfaultfd.Range{Start: p, Len: userfaultfd.PageSize})
	}
	for _, i := range ev.heldR {
		c.ring.complete(i, proto.RingDone) // the access is retried: it faults again if evicted
	}
	ev.held, ev.heldR, ev.batch = nil, nil, nil
	clear(ev.removed)
	return c.nextBatch(ev)
}
