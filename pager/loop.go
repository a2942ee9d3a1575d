package pager

import (
	"errors"
	"net"
	"runtime"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// The driver of a client's loop: it owns the descriptors (the uffd, the
// socket, the pidfd, the wake eventfd), polls them, hands each event to
// the part it belongs to (fault.go, events.go, evict.go, fork.go,
// relocate.go) and runs the timed steps; docs/pager.md, The loop's
// structure.

// attach hands the client its connection and pid (from the agent's
// goroutine) and wakes the loop.
func (c *client) attach(conn *net.UnixConn, pid int) {
	c.ctl.hand(conn, pid)
	c.pidAtm.Store(int64(pid))
	c.wake()
}

// shutdown asks the loop to stop and waits for it.
func (c *client) shutdown() {
	c.ctl.stopLoop()
	c.wake()
	<-c.done
}

// RoutineServe is the client's loop: one goroutine on a locked OS thread
// that owns every piece of the client's state. It reads the clock
// (Options.Now) once a turn, when poll returns, and passes that time to
// what the turn runs: the parts decide with it (raft's Tick, as an
// argument); a batch of faults read takes its own arrival time.
func (c *client) RoutineServe() {
	defer close(c.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.a.loopsAdd(1) // Options.LoopsChanged
	defer c.a.loopsAdd(-1)
	defer c.teardown()
	now := c.a.opts.Now()
	for {
		c.a.watch.note() // the last turn's work is done
		if c.control() {
			return
		}
		c.forkSettled(now)
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
		if len(c.fq.retry) > 0 || len(c.fq.holes) > 0 || c.ev.staged > 0 || c.room.reloc.pending(c) || c.parked() || c.fk.preparing {
			timeout = int(retryPeriod / time.Millisecond)
		}
		// Poll a while before blocking: while faults come fast, the next
		// one is caught without a wake-up of this thread (package spin).
		// The fault ring is polled too, and before blocking the loop says
		// it sleeps there (threads that post then ring the doorbell, the
		// wake eventfd).
		n, err := 0, error(nil)
		posted := c.ringPosted()
		start, until := c.spin.Start()
		for n == 0 && !posted && err == nil && c.spin.Polling(until) {
			n, err = unix.Poll(c.fq.pfds, 0)
			posted = c.ringPosted() || n == 0 && err == nil && c.watchRing()
		}
		hit := n > 0 || posted
		if !hit && err == nil && (c.ring == nil || !c.ring.sleep()) {
			_, err = unix.Poll(c.fq.pfds, timeout)
			if c.ring != nil {
				c.ring.awake()
			}
		}
		c.spin.Done(start, until, hit)
		if err != nil && !errors.Is(err, unix.EINTR) {
			c.log.Error("poll failed; dropping client", zap.Error(err))
			return
		}
		now = c.a.opts.Now()
		for _, p := range c.fq.pfds {
			switch {
			case p.Revents == 0:
			case int(p.Fd) == c.wakefd:
				var b [8]byte
				unix.Read(c.wakefd, b[:])
				if c.room.pausing() && c.a.slots.hasFree() {
					c.room.resume() // onRoom: evict now, not at the pause's end
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
				if !c.serveSocket(now) {
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
		c.serveRing()
		c.serveHoles(now)
		c.unpageSegments()
		c.relocate()
		c.trim()
		c.maybeEvict(now)
		c.retryHeld(now)
		c.retryWriteBack()
		c.maybeEvict(now)
		c.wakeHoles()
		if c.sock.pidfd < 0 && c.gone(now) {
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
// fault, a page not mapped is not touched. A probe is made once every
// probePeriod (now: the turn's time). Not of a ring client's page that is
// writable (dirty, or being evicted: its helper protects it after the
// pins): a system call may have it pinned, and the kernel's write into it
// would fail with EFAULT (docs/pager.md, Misses in the faulting thread);
// the probe waits for a period in which the page is not.
func (c *client) gone(now time.Time) bool {
	if len(c.regs.list) == 0 {
		return false
	}
	if c.ring != nil {
		if p := c.regs.list[0].pages[0]; p.Has(FlagBusy) || (p.State() == Resident && p.Has(FlagDirty)) {
			return false
		}
	}
	if !c.sock.probeDue(now) {
		return false
	}
	err := c.uffd.WriteProtect(pageRange(c.regs.list[0].start))
	return errors.Is(err, unix.ESRCH)
}

// control applies what the agent asked for; it reports whether to stop.
func (c *client) control() bool {
	stop, conn, pid := c.ctl.take()
	if stop {
		return true
	}
	if conn != nil {
		c.sock.set(conn, pid, c.log)
		c.startJournal(pid, c.uid.Load()) // now that the pid is known (a forked child's)
	}
	return false
}

// teardown frees everything the client holds. The client's evicted pages
// go back to the pool only if the process is gone (pidfd fired or the
// uffd hung up): on agent shutdown they stay, and the client, which holds
// its own reference to the uffd, blocks on its next fault instead of
// reading zeros.
func (c *client) teardown() {
	if !c.ctl.stopped() {
		c.a.freeRegions(c.regs.list)
		c.cj.remove()
	} else {
		c.cj.detach(c.regs.list) // for the agent after this one
	}
	for _, r := range c.regs.list {
		if r.px != nil {
			c.a.shm.leave(r) // before its uffd closes
		}
	}
	c.io.Close()
	c.uffd.Close()
	c.sock.close()
	c.ctl.closePending()
	c.ev.release()
	unix.Close(c.wakefd)
	c.a.dropClient(c)
}

// serveUFFD reads and handles pending uffd messages in batches, until
// none is left or a FORK is parked.
func (c *client) serveUFFD() {
	for !c.parked() {
		if len(c.fq.early) > 0 {
			c.handleMsgs(c.fq.takeEarly())
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

// ringPosted reports whether the fault ring has a fault to take.
func (c *client) ringPosted() bool { return c.ring != nil && !c.parked() && c.ring.pending() }

// watchRing watches the fault ring for a post a while (ringWatch).
func (c *client) watchRing() bool {
	return c.ring != nil && !c.parked() && c.ring.watch(ringWatch)
}

// serveRing serves the faults posted in the fault ring as a batch read
// from the uffd: each is a fault (a write to a page the loop holds
// resident is a write-protect fault), completed when its page is mapped
// (gatedUFFD). A fault outside the client's regions is tried as a
// registered range the agent does not know yet (a zero page, as from the
// uffd), and otherwise is not the pager's: its SIGBUS goes to the program.
func (c *client) serveRing() {
	if c.ring == nil || c.parked() {
		return
	}
	now := c.a.opts.Now()
	c.ring.take(func(i int, a userfaultfd.Addr, flags userfaultfd.FaultFlags) {
		c.st.ringFaults.Add(1)
		r, idx := c.regs.find(a)
		c.ring.serve(i, a, r != nil && r.pages[idx].State() != Absent) // a first touch is no stall
		if r == nil {
			c.st.faults.Add(1)
			if _, err := c.zeroFill(a, now); err != nil {
				c.ring.completeEntry(i, proto.RingNotMine)
			}
			return
		}
		if flags&userfaultfd.FaultWrite != 0 && r.pages[idx].State() == Resident {
			flags |= userfaultfd.FaultWP
			c.st.wpFaults.Add(1)
		} else {
			c.st.faults.Add(1)
		}
		c.fault(a, flags, now, now)
	})
	c.flushReads(now, now)
}

// handleMsgs handles a batch of uffd messages. The clock is read once for
// the batch: its faults' arrival (their latency and their wait count from
// it) and the time of what their handling decides.
func (c *client) handleMsgs(msgs []userfaultfd.Msg) {
	now := c.a.opts.Now()
	for i := range msgs {
		ev, err := msgs[i].Decode()
		if err != nil {
			c.log.Error("bad uffd message", zap.Error(err))
			if msgs[i].Kind() == userfaultfd.EventFork {
				c.uffd.forkHandled() // not to be handled: nothing waits for it
			}
			continue
		}
		switch ev.Kind {
		case userfaultfd.EventPagefault:
			if ev.Flags&userfaultfd.FaultWP == 0 {
				c.st.faults.Add(1)
			} else {
				c.st.wpFaults.Add(1)
			}
			c.fault(ev.Addr.RoundDown(pageSize), ev.Flags, now, now)
		case userfaultfd.EventFork:
			// Before the batch's READs are installed: the child's page
			// tables were copied when the event was raised, without the
			// pages still in flight, so its copy of ours must say they
			// are in the pool (installing first would say resident).
			if c.mustPark(now) {
				c.park(msgs[i:], now) // the READs are not installed (errForkAhead)
				c.flushReads(now, now)
				return
			}
			c.event(ev)
		default:
			c.flushReads(now, now)
			c.event(ev)
		}
	}
	c.flushReads(now, now)
}

// forkSettled resumes a fork that waited for the eviction in flight, when
// it may: its FORK event and the messages after it are handled, or its
// FORK_PREPARE answered; now is the turn's time.
func (c *client) forkSettled(now time.Time) {
	if (!c.parked() && !c.fk.preparing) || c.mustPark(now) {
		return
	}
	if c.parked() {
		c.handleMsgs(c.fk.unpark())
	}
	if c.fk.preparing && !c.mustPark(now) {
		c.fk.preparing = false
		err := c.finishForkPrepare()
		if c.sock.conn == nil {
			return // the client went away meanwhile
		}
		if err := c.sock.reply(c.fk.prepareSeq, err); err != nil {
			c.log.Warn("answering FORK_PREPARE failed", zap.Error(err))
			c.sock.drop()
		}
	}
}
