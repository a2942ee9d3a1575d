package pagertest

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// Process is the client side of an agent's connection for a process
// whose address space is a Kernel: what the shim does for a real one. It
// announces regions (REGION_ADD, REGION_DEL, REGION_ZAP, answered ACK or
// ERROR) and runs the helper thread that answers EVICT: each victim with
// a staging slot is copied into the staging memfd, the victims are
// dropped (Kernel.Drop, the shim's MADV_DONTNEED), and EVICTED says how
// many were done.
type Process struct {
	K *Kernel

	conn    *net.UnixConn
	staging []byte
	sendMu  sync.Mutex
	sendBuf []byte
	seq     uint32
	replies chan reply
	done    chan struct{}
	evicts  atomic.Int64 // EVICT batches answered
	evicted atomic.Int64 // pages dropped for them

	closeOnce sync.Once

	holdMu  sync.Mutex
	hold    bool          // PauseHelper: EVICTs wait unanswered
	pending *proto.Evict  // the one waiting
	held    chan struct{} // closed when an EVICT is held (WaitEvict); nil: no one waits
}

type reply struct {
	seq uint32
	err error
}

// NewProcess runs the client side of conn for k; stagingFD (owned from
// now on) is the client's staging memfd of slots pages. Close ends it.
func NewProcess(k *Kernel, conn *net.UnixConn, stagingFD, slots int) (*Process, error) {
	staging, err := unix.Mmap(stagingFD, 0, slots*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(stagingFD)
	if err != nil {
		return nil, fmt.Errorf("pagertest: map staging: %w", err)
	}
	p := &Process{K: k, conn: conn, staging: staging, sendBuf: make([]byte, 0, proto.MaxPacket),
		replies: make(chan reply, 1), done: make(chan struct{})}
	go p.routineHelper()
	return p, nil
}

// NewRingProcess is NewProcess for a process whose faults come through the
// fault ring (HelloRing): k is put in SIGBUS mode (Kernel.UseRing) on the
// ring of the staging memfd, after its slots, and doorbell (owned from now
// on).
func NewRingProcess(k *Kernel, conn *net.UnixConn, stagingFD, slots, doorbell int) (*Process, error) {
	ring, err := unix.Mmap(stagingFD, int64(slots)*PageSize, proto.RingSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(stagingFD)
		unix.Close(doorbell)
		return nil, fmt.Errorf("pagertest: map the fault ring: %w", err)
	}
	k.UseRing(ring, doorbell)
	return NewProcess(k, conn, stagingFD, slots)
}

// Evictions returns the EVICT batches the helper answered and the pages
// it dropped for them.
func (p *Process) Evictions() (batches, pages int) {
	return int(p.evicts.Load()), int(p.evicted.Load())
}

// AddRegion announces region id over r and waits for the answer.
func (p *Process) AddRegion(id uint64, r userfaultfd.Range) error {
	return p.request(&proto.RegionAdd{ID: id, Range: r, Kind: proto.KindMmap})
}

// DelRegion announces the unmapping of r of region id (then drops its
// pages, as munmap does).
func (p *Process) DelRegion(id uint64, r userfaultfd.Range) error {
	err := p.request(&proto.RegionDel{ID: id, Range: r})
	p.K.Drop(r)
	return err
}

// ZapRegion drops r of region id (madvise(MADV_DONTNEED) by the program)
// and tells the agent, as the shim does.
func (p *Process) ZapRegion(id uint64, r userfaultfd.Range) error {
	p.K.Drop(r)
	return p.request(&proto.RegionZap{ID: id, Range: r})
}

func (p *Process) request(m proto.Message) error {
	seq, err := p.ask(m)
	if err != nil {
		return err
	}
	return p.answerTo(seq)
}

// ask sends request m and returns its seq; answerTo waits for its answer.
func (p *Process) ask(m proto.Message) (uint32, error) {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.seq++
	return p.seq, proto.Send(p.conn, p.sendBuf, p.seq, m)
}

// answerTo waits for the answer to request seq.
func (p *Process) answerTo(seq uint32) error {
	select {
	case r := <-p.replies:
		if r.seq != seq {
			return fmt.Errorf("pagertest: answer to request %d, want %d", r.seq, seq)
		}
		return r.err
	case <-p.done:
		return errors.New("pagertest: connection closed")
	case <-time.After(10 * time.Second):
		return errors.New("pagertest: no answer in 10 s")
	}
}

func (p *Process) send(m proto.Message) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.seq++
	return proto.Send(p.conn, p.sendBuf, p.seq, m)
}

// routineHelper reads the agent's packets until the connection closes.
func (p *Process) routineHelper() {
	defer close(p.done)
	buf := make([]byte, proto.MaxPacket)
	oob := make([]byte, proto.OOBSize)
	var fds [proto.MaxFDs]int
	var ev proto.Evict
	for {
		pkt, nfds, err := proto.Recv(p.conn, buf, oob, fds[:])
		for _, fd := range fds[:nfds] {
			unix.Close(fd)
		}
		if err != nil {
			return
		}
		h, body, err := proto.Parse(pkt)
		if err != nil {
			return
		}
		switch h.Type {
		case proto.TypeAck:
			var m proto.Ack
			err := m.Decode(body)
			p.answer(reply{m.Seq, err})
		case proto.TypeError:
			var m proto.Error
			if err := m.Decode(body); err != nil {
				p.answer(reply{0, err})
				continue
			}
			p.answer(reply{m.Seq, fmt.Errorf("agent: %s: %w", m.Text, m.Errno)})
		case proto.TypeEvict:
			if err := ev.Decode(body); err != nil {
				return
			}
			p.holdMu.Lock()
			if p.hold {
				held := ev
				p.pending = &held
				if p.held != nil {
					close(p.held)
					p.held = nil
				}
				p.holdMu.Unlock()
				continue
			}
			p.holdMu.Unlock()
			p.evict(&ev)
		default:
			return
		}
	}
}

// answer hands r to the request waiting for it (none: a late answer,
// dropped).
func (p *Process) answer(r reply) {
	select {
	case p.replies <- r:
	default:
	}
}

// evict does what the shim's helper does for an EVICT: in SIGBUS mode it
// write-protects the dirty victims (those with a staging slot) first.
func (p *Process) evict(ev *proto.Evict) {
	done := 0
	errno := unix.Errno(0)
	for _, e := range ev.Pages[:ev.N] {
		if e.Slot != proto.NoSlot && !p.K.protectVictim(e.Addr) {
			break
		}
	}
	for _, e := range ev.Pages[:ev.N] {
		if e.Slot != proto.NoSlot {
			if int(e.Slot+1)*PageSize > len(p.staging) || !p.K.CopyOut(e.Addr, p.staging[int(e.Slot)*PageSize:]) {
				errno = unix.EFAULT
				break
			}
		}
		done++
	}
	for _, e := range ev.Pages[:done] {
		p.K.Drop(userfaultfd.Range{Start: e.Addr, Len: PageSize})
	}
	p.evicts.Add(1)
	p.evicted.Add(int64(done))
	p.send(&proto.Evicted{Batch: ev.Batch, Done: uint32(done), Errno: errno})
}

// PauseHelper makes the helper leave EVICTs unanswered (a helper thread
// that does not get to run) until ResumeHelper.
func (p *Process) PauseHelper() {
	p.holdMu.Lock()
	p.hold = true
	p.holdMu.Unlock()
}

// EvictPending reports whether an EVICT waits for ResumeHelper.
func (p *Process) EvictPending() bool {
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	return p.pending != nil
}

// WaitEvict waits (d at most) for an EVICT to wait for ResumeHelper; it
// reports whether one does.
func (p *Process) WaitEvict(d time.Duration) bool {
	p.holdMu.Lock()
	if p.pending != nil {
		p.holdMu.Unlock()
		return true
	}
	if p.held == nil {
		p.held = make(chan struct{})
	}
	held := p.held
	p.holdMu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-held:
		return true
	case <-p.done:
	case <-t.C:
	}
	return p.EvictPending()
}

// ResumeHelper answers the EVICT that waits, if any, and the next ones.
func (p *Process) ResumeHelper() {
	p.holdMu.Lock()
	p.hold = false
	ev := p.pending
	p.pending = nil
	p.holdMu.Unlock()
	if ev != nil {
		p.evict(ev)
	}
}

// ForkPrepare says FORK_PREPARE for fork serial and waits for the answer,
// as the shim's fork() wrapper does before fork(2).
func (p *Process) ForkPrepare(serial uint64) error {
	return p.request(&proto.ForkPrepare{Serial: serial})
}

// ForkPrepareAsync says FORK_PREPARE for fork serial as ForkPrepare does,
// but returns once it is sent: the answer comes on the channel.
func (p *Process) ForkPrepareAsync(serial uint64) <-chan error {
	answer := make(chan error, 1)
	seq, err := p.ask(&proto.ForkPrepare{Serial: serial})
	if err != nil {
		answer <- err
		return answer
	}
	go func() { answer <- p.answerTo(seq) }()
	return answer
}

// ForkDone says FORK_DONE for fork serial with the child's pid (or
// -errno), as the shim does when fork(2) returns.
func (p *Process) ForkDone(serial uint64, pid int32) error {
	return p.send(&proto.ForkDone{Serial: serial, PID: pid})
}

// Close closes the connection and waits for the helper; it may be called
// again.
func (p *Process) Close() {
	p.closeOnce.Do(func() {
		p.conn.Close()
		<-p.done
		unix.Munmap(p.staging)
	})
}
