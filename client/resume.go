package client

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// When the agent goes away (killed, restarted), the client keeps its uffd,
// regions and staging area, and connects again to whichever agent serves
// the socket: a resuming HELLO hands it the uffd and the staging memfd,
// then the regions are re-announced (docs/pager.md, Agent restart).
// Meanwhile faults on pages the agent had evicted wait in the kernel;
// requests (Map, Unmap) fail. A fault that waits longer than
// proto.AgentWait ends the process with SIGBUS (it would never be served
// with the data it needs; never zeros).

// resumePoll is how often the client tries the socket again.
const resumePoll = 100 * time.Millisecond

// resume reconnects and resumes with the next agent; it returns nil once
// one serves the client, or an error when the client is closed.
func (c *Client) resume() error {
	bound := proto.AgentWait()
	var pendingSince time.Time
	for {
		if c.isClosed() {
			return ErrClosed
		}
		conn, err := proto.Dial(c.path)
		if err == nil {
			if err = c.resumeOn(conn); err == nil {
				return nil
			}
			conn.Close()
			fmt.Fprintf(os.Stderr, "rmem: resuming with the agent at %s failed: %v\n", c.path, err)
		}
		if c.faultPending() {
			if pendingSince.IsZero() {
				pendingSince = time.Now()
			}
			if time.Since(pendingSince) > bound {
				fmt.Fprintf(os.Stderr, "rmem: no agent resumed this process within %v (%s); a fault on a page in the pool cannot be served: SIGBUS\n", bound, proto.EnvAgentWait)
				unix.Kill(os.Getpid(), unix.SIGBUS)
				time.Sleep(time.Second)
				os.Exit(128 + int(unix.SIGBUS))
			}
		} else {
			pendingSince = time.Time{}
		}
		time.Sleep(resumePoll)
	}
}

// faultPending reports whether a fault (or event) waits on the uffd.
func (c *Client) faultPending() bool {
	p := [1]unix.PollFd{{Fd: int32(c.uffd.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(p[:], 0)
	return err == nil && n > 0
}

// resumeOn says a resuming HELLO on conn, re-announces the regions and,
// once the agent serves them, makes conn the client's connection.
func (c *Client) resumeOn(conn *net.UnixConn) error {
	buf := make([]byte, 0, proto.MaxPacket)
	h := proto.Hello{PID: int32(os.Getpid()), PPID: int32(os.Getppid()), Features: c.features,
		PageSize: pageSize, Flags: proto.HelloUFFD | proto.HelloResume}
	if err := proto.Send(conn, buf, 1, &h, c.uffd.Fd(), c.stagingFD); err != nil {
		return err
	}
	rbuf := make([]byte, proto.MaxPacket)
	oob := make([]byte, proto.OOBSize)
	var fds [proto.MaxFDs]int
	pkt, nfds, err := proto.Recv(conn, rbuf, oob, fds[:])
	for _, fd := range fds[:nfds] {
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	var w proto.Welcome
	if _, err := proto.Expect(pkt, &w); err != nil {
		return fmt.Errorf("agent refused: %w", err)
	}
	if int(w.StagingSlots)*pageSize != len(c.staging) {
		return fmt.Errorf("the agent wants %d staging slots, this client has %d", w.StagingSlots, len(c.staging)/pageSize)
	}
	if w.Flags&proto.WelcomeResumed == 0 {
		fmt.Fprintln(os.Stderr, "rmem: the new agent has no journal of this process: its pages that were in the pool are lost (touching one raises SIGBUS)")
	}
	c.mu.Lock()
	adds := make([]proto.RegionAdd, 0, len(c.regions))
	for start, r := range c.regions {
		kind := proto.KindMmap
		if r.shared {
			kind = proto.KindShared
		}
		adds = append(adds, proto.RegionAdd{ID: r.id, Range: rangeOf(start, len(r.mem)), Kind: kind, Flags: proto.RegionResumed})
	}
	c.mu.Unlock()
	for i := range adds {
		if err := proto.Send(conn, buf, 2, &adds[i]); err != nil {
			return err
		}
	}
	if err := proto.Send(conn, buf, 3, &proto.ResumeDone{Regions: uint32(len(adds))}); err != nil {
		return err
	}
	pkt, nfds, err = proto.Recv(conn, rbuf, oob, fds[:])
	for _, fd := range fds[:nfds] {
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	var ack proto.Ack
	if _, err := proto.Expect(pkt, &ack); err != nil {
		return fmt.Errorf("resume refused: %w", err)
	}
	c.sendMu.Lock()
	old := c.conn
	c.conn = conn
	c.sendMu.Unlock()
	old.Close()
	c.mu.Lock()
	c.id, c.err = w.ClientID, nil
	c.mu.Unlock()
	return nil
}

func rangeOf(start uintptr, n int) userfaultfd.Range {
	return userfaultfd.Range{Start: userfaultfd.Addr(start), Len: uint64(n)}
}
