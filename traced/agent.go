package traced

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/procinfo"
	"rmem/userfaultfd"
)

// agent is the program's connection to memagent, as the shim's would be:
// the tracer's requests (REGION_ADD, REGION_ZAP, REGION_DEL) wait for
// their replies, which the reader goroutine hands over; the reader serves
// EVICT itself (process_vm_readv into the staging slots, the parasite's
// madvise).
type agent struct {
	conn     *net.UnixConn
	log      *zap.Logger
	pid      int
	pidfd    int    // the program's (the tracer's, open while this is), or -1
	id       uint64 // the agent's client id
	minAlloc uint64
	staging  []byte

	sendMu  sync.Mutex
	sendBuf []byte

	mu      sync.Mutex // guards seq, waiters, err, closing
	seq     uint32
	waiters map[uint32]chan error
	err     error
	closing bool // close was called: the end of the connection is ours

	// evictMu is held while an EVICT is served; hold, set under it,
	// makes EVICTs keep every page (EBUSY) until release.
	evictMu sync.Mutex
	hold    bool
	par     *parasite

	done chan struct{}
}

// helloArgs are what a HELLO for a traced process says.
type helloArgs struct {
	pid, ppid   int
	pidfd       int    // the process's (the tracer's, open while the agent is), -1 for none
	serial      uint64 // a forked child's FORK_PREPARE, 0 for a new image
	localMem    uint64
	maxSlowdown uint32
}

// dial says HELLO for h.pid (proto.HelloTraced) with its uffd, maps the
// staging area the WELCOME gives and starts the reader.
func dial(socket string, ha helloArgs, u *userfaultfd.UFFD, par *parasite, log *zap.Logger) (*agent, error) {
	conn, err := proto.Dial(socket)
	if err != nil {
		return nil, fmt.Errorf("traced: %w", err)
	}
	h := proto.Hello{PID: int32(ha.pid), PPID: int32(ha.ppid), ForkSerial: ha.serial, Features: u.Features(), PageSize: pageSize,
		Flags: proto.HelloUFFD | proto.HelloTraced, LocalMem: ha.localMem, MaxSlowdown: ha.maxSlowdown}
	buf := make([]byte, proto.MaxPacket)
	if err := proto.Send(conn, buf[:0], 1, &h, u.Fd()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("traced: HELLO: %w", err)
	}
	var fds [proto.MaxFDs]int
	pkt, nfds, err := proto.Recv(conn, buf, make([]byte, proto.OOBSize), fds[:])
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("traced: waiting for WELCOME: %w", err)
	}
	defer func() {
		for _, fd := range fds[:nfds] {
			unix.Close(fd)
		}
	}()
	var w proto.Welcome
	if _, err = proto.Expect(pkt, &w); err != nil {
		conn.Close()
		return nil, fmt.Errorf("traced: the agent refused: %w", err)
	}
	if nfds != w.FDs() || nfds < 1 {
		conn.Close()
		return nil, fmt.Errorf("traced: WELCOME carried %d descriptors, want %d", nfds, w.FDs())
	}
	st, err := unix.Mmap(fds[0], 0, int(w.StagingSlots)*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("traced: map the staging area: %w", err)
	}
	a := &agent{conn: conn, log: log, pid: ha.pid, pidfd: ha.pidfd, id: w.ClientID, minAlloc: w.MinAlloc, staging: st,
		sendBuf: make([]byte, 0, proto.MaxPacket), waiters: map[uint32]chan error{}, par: par, done: make(chan struct{})}
	if a.minAlloc == 0 {
		a.minAlloc = proto.DefaultMinAlloc
	}
	go a.routineRead()
	return a, nil
}

// close ends the connection and waits for the reader.
func (a *agent) close() {
	a.mu.Lock()
	a.closing = true
	a.mu.Unlock()
	a.conn.Close()
	<-a.done
	unix.Munmap(a.staging)
}

// request sends m and waits for its ACK or ERROR.
func (a *agent) request(m proto.Message) error {
	ch := make(chan error, 1)
	a.mu.Lock()
	if a.err != nil {
		err := a.err
		a.mu.Unlock()
		return err
	}
	a.seq++
	seq := a.seq
	a.waiters[seq] = ch
	a.mu.Unlock()
	if err := a.send(seq, m); err != nil {
		a.mu.Lock()
		delete(a.waiters, seq)
		a.mu.Unlock()
		return err
	}
	return <-ch
}

func (a *agent) send(seq uint32, m proto.Message) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return proto.Send(a.conn, a.sendBuf, seq, m)
}

func (a *agent) answer(seq uint32, err error) {
	a.mu.Lock()
	ch := a.waiters[seq]
	delete(a.waiters, seq)
	a.mu.Unlock()
	if ch != nil {
		ch <- err
	}
}

// fail ends every request in flight with err.
func (a *agent) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.err = err
	}
	for seq, ch := range a.waiters {
		ch <- a.err
		delete(a.waiters, seq)
	}
}

// routineRead reads the agent's messages until the connection ends.
func (a *agent) routineRead() {
	defer close(a.done)
	buf := make([]byte, proto.MaxPacket)
	oob := make([]byte, proto.OOBSize)
	var fds [proto.MaxFDs]int
	var ev proto.Evict
	for {
		pkt, nfds, err := proto.Recv(a.conn, buf, oob, fds[:])
		for _, fd := range fds[:nfds] {
			unix.Close(fd)
		}
		if err != nil {
			a.fail(fmt.Errorf("traced: lost the agent: %w", err))
			a.lost(err)
			return
		}
		h, body, err := proto.Parse(pkt)
		if err != nil {
			a.fail(err)
			return
		}
		switch h.Type {
		case proto.TypeAck:
			var m proto.Ack
			if m.Decode(body) == nil {
				a.answer(m.Seq, nil)
			}
		case proto.TypeError:
			var m proto.Error
			if m.Decode(body) == nil {
				a.answer(m.Seq, &m)
			}
		case proto.TypeEvict:
			if err := ev.Decode(body); err != nil {
				a.fail(err)
				return
			}
			done, errno := a.evict(&ev)
			if err := a.send(0, &proto.Evicted{Batch: ev.Batch, Done: done, Errno: errno}); err != nil && !errors.Is(err, net.ErrClosed) {
				a.log.Debug("sending EVICTED failed", zap.Error(err))
			}
		}
	}
}

// lost handles the end of the connection: the tracer's close, or the
// agent gone (killed, restarted). A shim's program waits for the next
// agent to resume it; a traced one cannot be resumed (its tracer holds
// what a resume needs), and its faults on evicted pages would wait for
// good: it is killed, loudly, rather than left hanging.
func (a *agent) lost(err error) {
	a.mu.Lock()
	closing, pidfd := a.closing, a.pidfd
	a.mu.Unlock()
	if closing || pidfd < 0 || procinfo.Exited(a.pid) {
		return
	}
	a.log.Error("the agent went away: a traced program cannot wait for another; killing it", zap.Error(err))
	unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
}

// holdPages makes EVICTs keep every page from now on (after the one in
// flight, if any, is done), until releasePages.
func (a *agent) holdPages() {
	a.evictMu.Lock()
	a.hold = true
	a.evictMu.Unlock()
}

func (a *agent) releasePages() {
	a.evictMu.Lock()
	a.hold = false
	a.evictMu.Unlock()
}

// evict copies each victim with a slot into it (the agent write-protected
// the pages: they cannot change meanwhile) and has the parasite drop them,
// a run of adjacent pages at a time. It returns how many pages (from the
// first) are gone.
func (a *agent) evict(ev *proto.Evict) (uint32, unix.Errno) {
	a.evictMu.Lock()
	defer a.evictMu.Unlock()
	pages := ev.Pages[:ev.N]
	if a.hold {
		return 0, unix.EBUSY
	}
	var local [proto.MaxEvictBatch]unix.Iovec
	var remote [proto.MaxEvictBatch]unix.RemoteIovec
	n, want := 0, 0
	for _, p := range pages {
		if p.Slot == proto.NoSlot {
			continue
		}
		if (int(p.Slot)+1)*pageSize > len(a.staging) {
			return 0, unix.EINVAL
		}
		local[n].Base = &a.staging[int(p.Slot)*pageSize]
		local[n].SetLen(pageSize)
		remote[n] = unix.RemoteIovec{Base: uintptr(p.Addr), Len: pageSize}
		n++
		want += pageSize
	}
	if n > 0 {
		got, err := unix.ProcessVMReadv(a.pid, local[:n], remote[:n], 0)
		if err != nil || got != want {
			a.log.Debug("copying victims out failed", zap.Int("got", got), zap.Int("want", want), zap.Error(err))
			return 0, unix.EFAULT
		}
	}
	var addrs, lens [proto.MaxEvictBatch]uint64
	var first [proto.MaxEvictBatch]int // the first page of each run
	runs := 0
	for i := 0; i < len(pages); {
		j := i + 1
		for j < len(pages) && pages[j].Addr == pages[j-1].Addr+pageSize {
			j++
		}
		addrs[runs], lens[runs], first[runs] = uint64(pages[i].Addr), uint64(j-i)*pageSize, i
		runs++
		i = j
	}
	done, err := a.par.drop(addrs[:runs], lens[:runs])
	if err != nil {
		a.log.Warn("dropping evicted pages failed", zap.Error(err))
		if done < runs {
			return uint32(first[done]), unix.EFAULT
		}
	}
	return uint32(len(pages)), 0
}
