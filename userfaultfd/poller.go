package userfaultfd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Poller waits for messages on a UFFD. It polls the uffd together with an
// eventfd, so Stop, Close, UFFD.Close and context cancellation end a wait
// promptly, and it starts no goroutine of its own (Run's context watcher
// is a context.AfterFunc that exits once it has fired).
//
// A stopped Poller stays stopped: every later Wait returns ErrStopped.
type Poller struct {
	u       *UFFD
	efd     int
	stopped atomic.Bool

	// mu is held shared by Wait and exclusively by Close, so Close can
	// wait for in-flight Waits before closing the fds.
	mu     sync.RWMutex
	closed bool
}

// NewPoller attaches a Poller to u (one per UFFD).
func NewPoller(u *UFFD) (*Poller, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("userfaultfd: eventfd for poller: %w", err)
	}
	p := &Poller{u: u, efd: efd}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		unix.Close(efd)
		return nil, ErrClosed
	}
	if u.poller != nil {
		unix.Close(efd)
		return nil, errors.New("userfaultfd: UFFD already has a poller")
	}
	u.poller = p
	return p, nil
}

// Wait blocks until messages are pending, reads as many as fit in msgs and
// returns how many. It returns ErrStopped once the Poller is stopped and
// ErrClosed once it is closed. No allocation.
func (p *Poller) Wait(msgs []Msg) (int, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return 0, ErrClosed
	}
	for {
		if p.stopped.Load() {
			return 0, ErrStopped
		}
		n, err := p.u.ReadEvents(msgs)
		if err == nil {
			return n, nil
		}
		if err != unix.EAGAIN {
			return 0, err
		}
		fds := [2]unix.PollFd{
			{Fd: int32(p.u.fd), Events: unix.POLLIN},
			{Fd: int32(p.efd), Events: unix.POLLIN},
		}
		if _, err := unix.Poll(fds[:], -1); err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("userfaultfd: poll: %w", err)
		}
		if fds[1].Revents != 0 {
			return 0, ErrStopped
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLNVAL|unix.POLLHUP) != 0 {
			return 0, fmt.Errorf("userfaultfd: poll: uffd revents %#x: %w", fds[0].Revents, unix.EIO)
		}
	}
}

// Stop makes the current and every later Wait return ErrStopped. Safe to
// call from any goroutine, any number of times.
func (p *Poller) Stop() {
	if p.stopped.Swap(true) {
		return
	}
	var one = [8]byte{1}
	unix.Write(p.efd, one[:]) // cannot fail short of a closed fd; the flag covers that
}

// Run calls handle with each batch of messages until ctx ends (returns
// ctx.Err()), the Poller is stopped or closed (ErrStopped/ErrClosed), or
// handle or a read fails (that error). Decoded FORK fds are the handler's
// to own.
func (p *Poller) Run(ctx context.Context, msgs []Msg, handle func([]Msg) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, p.Stop)
	defer stop()
	for {
		n, err := p.Wait(msgs)
		if err != nil {
			if errors.Is(err, ErrStopped) && ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if err := handle(msgs[:n]); err != nil {
			return err
		}
	}
}

// Close stops the Poller, waits for in-flight Waits to return, detaches it
// from its UFFD and closes the eventfd. It does not close the UFFD. Safe
// to call twice.
func (p *Poller) Close() error {
	p.stopAndDrain()
	p.u.mu.Lock()
	if p.u.poller == p {
		p.u.poller = nil
	}
	p.u.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return unix.Close(p.efd)
}

// stopAndDrain stops the Poller and returns once no Wait is in flight.
func (p *Poller) stopAndDrain() {
	p.Stop()
	p.mu.Lock()
	p.mu.Unlock() //nolint:staticcheck // empty critical section: a barrier
}
