// Package connset is the connection bookkeeping a stream provider's
// listener needs: accept in a goroutine, refuse past a bound, serve each
// connection in its own goroutine, and on Close stop accepting, shut every
// connection and wait for all of them.
//
// It is for rdma providers' servers (tcp, shm); it knows nothing of their
// wire formats. It is not a general-purpose server framework.
package connset

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Conn is what a provider serves for one accepted connection.
type Conn interface {
	// Serve handles the connection until it ends.
	Serve()
	// Shutdown makes Serve return soon; it may be called from another
	// goroutine, while Serve runs.
	Shutdown()
}

// Set serves the connections of one listener.
type Set struct {
	ln   net.Listener
	max  int
	open func(net.Conn) (Conn, error)

	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[Conn]struct{} // guarded by mu
	closed bool              // guarded by mu
}

// Serve accepts connections on ln until Close. open turns each into a
// Conn (an error closes it); past max live connections (0: no bound) new
// ones are closed at accept.
func Serve(ln net.Listener, max int, open func(net.Conn) (Conn, error)) *Set {
	s := &Set{ln: ln, max: max, open: open, conns: map[Conn]struct{}{}}
	s.wg.Add(1)
	go s.routineAccept()
	return s
}

// Len returns the number of connections being served.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting, shuts every connection down and waits for all of
// the set's goroutines. Safe to call twice.
func (s *Set) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Shutdown()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Set) routineAccept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(5 * time.Millisecond) // e.g. EMFILE: back off, keep serving
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			continue
		}
		s.mu.Lock()
		if s.closed || (s.max > 0 && len(s.conns) >= s.max) {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		c, err := s.open(nc)
		if err != nil {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.Serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}
