//go:build verbs

package verbs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
)

// listener serves a Domain over verbs: a TCP control listener, and per
// client connection a protection domain, an RC QP and one MR per key the
// client resolved.
type listener struct {
	ln   net.Listener
	d    *rdma.Domain
	cfg  Config
	opts rdma.ListenOptions

	mu       sync.Mutex
	sessions map[*session]struct{}
	closed   bool
	wg       sync.WaitGroup
}

var _ rdma.Listener = (*listener)(nil)

func listen(addr string, d *rdma.Domain, opts rdma.ListenOptions, cfg Config) (*listener, error) {
	// Fail now, not at the first client, when there is no device at all
	// or none serves the address to listen on.
	devs, err := listDevices()
	if err != nil {
		return nil, err
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			if _, err := choose(devs, ip, cfg); err != nil {
				return nil, err
			}
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma: verbs: listen %s: %w", addr, err)
	}
	l := &listener{ln: ln, d: d, cfg: cfg, opts: opts, sessions: map[*session]struct{}{}}
	l.wg.Add(1)
	go l.RoutineAccept()
	return l, nil
}

func (l *listener) Addr() string { return l.ln.Addr().String() }

// RoutineAccept accepts control connections until Close.
func (l *listener) RoutineAccept() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		l.mu.Lock()
		if l.closed || (l.opts.MaxConns > 0 && len(l.sessions) >= l.opts.MaxConns) {
			l.mu.Unlock()
			nc.Close()
			continue
		}
		s := &session{l: l, nc: nc, mrs: map[rdma.Key]*keyMR{}}
		l.sessions[s] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go s.RoutineServe()
	}
}

// Close stops accepting, ends every session (their QPs are destroyed and
// their MRs deregistered) and waits for the goroutines.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	for s := range l.sessions {
		s.nc.Close()
	}
	l.mu.Unlock()
	err := l.ln.Close()
	l.wg.Wait()
	return err
}

// keyMR is the MR registered for one key in one session: a mapping of the
// key's range of the region's memfd.
type keyMR struct {
	mapping []byte // page-aligned mapping that contains the range
	mr      *memRegion
	addr    uint64
	len     uint64
	access  rdma.Access
}

// session is one client connection.
type session struct {
	l  *listener
	nc net.Conn

	// mu guards the verbs objects; it is held across Session.Map and the
	// registration that follows, and by Fence, so that a revocation
	// either prevents the registration or deregisters it.
	mu   sync.Mutex
	sess *rdma.Session
	dev  *device
	pd   *protDomain
	cq   *complQueue
	qp   *queuePair
	mrs  map[rdma.Key]*keyMR
}

// RoutineServe runs one client connection's control exchange.
func (s *session) RoutineServe() {
	defer s.l.wg.Done()
	defer func() {
		s.l.mu.Lock()
		delete(s.l.sessions, s)
		s.l.mu.Unlock()
	}()
	defer s.teardown()
	var buf [msgSize]byte
	s.nc.SetDeadline(time.Now().Add(ctrlTimeout))
	m, err := readMsg(s.nc, buf[:])
	if err != nil || m.Type != msgHello {
		return
	}
	s.nc.SetDeadline(time.Time{})
	ep, err := s.setup(m.EP)
	if err != nil {
		return
	}
	if writeMsg(s.nc, buf[:], &msg{Type: msgWelcome, EP: ep}) != nil {
		return
	}
	for {
		m, err := readMsg(s.nc, buf[:])
		if err != nil {
			return
		}
		var rep msg
		switch m.Type {
		case msgResolve:
			rep = msg{Type: msgGrant, G: s.resolve(m.Key)}
		case msgReconnect:
			ep, err := s.reconnect(m.EP)
			if err != nil {
				return
			}
			rep = msg{Type: msgReconnected, EP: ep}
		default:
			return
		}
		if writeMsg(s.nc, buf[:], &rep) != nil {
			return
		}
	}
}

// setup opens the device serving the connection's local address and
// connects a QP to the client's.
func (s *session) setup(peer endpoint) (endpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dev, err := openFor(s.nc.LocalAddr(), s.l.cfg)
	if err != nil {
		return endpoint{}, err
	}
	s.dev = dev
	if s.pd, err = dev.allocPD(); err != nil {
		return endpoint{}, err
	}
	if s.cq, err = dev.createCQ(2); err != nil {
		return endpoint{}, err
	}
	s.sess = s.l.d.NewSession(rdma.SessionHooks{
		Abort: func() { s.nc.Close() },
		Fence: s.fence,
	})
	return s.newQPLocked(peer)
}

func (s *session) newQPLocked(peer endpoint) (endpoint, error) {
	if s.qp != nil {
		s.qp.destroy()
		s.qp = nil
	}
	qp, err := s.dev.createQP(s.pd, s.cq, 1, rand.Uint32(), true)
	if err != nil {
		return endpoint{}, err
	}
	s.qp = qp
	if err := s.dev.connect(qp, peer); err != nil {
		return endpoint{}, err
	}
	return s.dev.endpoint(qp, 0), nil
}

// reconnect replaces the QP after the client's broke (a remote access
// error moves both to the error state).
func (s *session) reconnect(peer endpoint) (endpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newQPLocked(peer)
}

// resolve checks k with the domain and registers an MR for its range in
// this session's protection domain.
func (s *session) resolve(k rdma.Key) grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, st := s.sess.Map(k)
	if st != rdma.StatusOK {
		if st == rdma.StatusPermission {
			// A region without a memfd cannot be mapped here.
			st = rdma.StatusUnknownKey
		}
		return grant{Status: st, Key: k}
	}
	if km := s.mrs[k]; km != nil {
		return grant{Access: km.access, RKey: km.mr.rkey, Addr: km.addr, Len: km.len, Key: k}
	}
	km, err := registerRange(s.pd, m)
	if err != nil {
		return grant{Status: rdma.StatusInvalid, Key: k}
	}
	s.mrs[k] = km
	return grant{Access: km.access, RKey: km.mr.rkey, Addr: km.addr, Len: km.len, Key: k}
}

// registerRange maps the key's range of the region's memfd (a second
// mapping of the same pages) and registers it.
func registerRange(pd *protDomain, m rdma.Mapping) (*keyMR, error) {
	var st unix.Stat_t
	if err := unix.Fstat(m.Fd, &st); err != nil {
		return nil, err
	}
	page := uint64(os.Getpagesize())
	if st.Blksize > 0 && uint64(st.Blksize) > page {
		page = uint64(st.Blksize) // hugetlbfs
	}
	start := m.Offset &^ (page - 1)
	end := (m.Offset + m.Len + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(m.Fd, int64(start), int(end-start), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("rdma: verbs: mmap key range: %w", err)
	}
	rng := mem[m.Offset-start : m.Offset-start+m.Len]
	mr, err := pd.register(rng, m.Access, m.Access&rdma.AccessWrite != 0)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return &keyMR{mapping: mem, mr: mr, addr: addrOf(rng), len: m.Len, access: m.Access}, nil
}

func (km *keyMR) release() error {
	if err := km.mr.deregister(); err != nil {
		return err
	}
	return unix.Munmap(km.mapping)
}

// fence is the Session's Fence hook: Revoke calls it after the key left
// the domain's table. Deregistering the MR makes every later op with its
// rkey fail with a remote access error, and returns once the device no
// longer touches the memory.
func (s *session) fence(ctx context.Context, k rdma.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	km := s.mrs[k]
	if km == nil {
		return nil
	}
	if err := km.release(); err != nil {
		return fmt.Errorf("rdma: verbs: deregister MR of key %s: %w", k, err)
	}
	delete(s.mrs, k)
	return nil
}

// teardown deregisters every MR and destroys the verbs objects.
func (s *session) teardown() {
	s.nc.Close()
	if s.sess != nil {
		s.sess.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.qp != nil {
		s.qp.destroy()
		s.qp = nil
	}
	for k, km := range s.mrs {
		km.release()
		delete(s.mrs, k)
	}
	if s.cq != nil {
		s.cq.destroy()
		s.cq = nil
	}
	if s.pd != nil {
		s.pd.free()
		s.pd = nil
	}
	if s.dev != nil {
		s.dev.close()
		s.dev = nil
	}
}
