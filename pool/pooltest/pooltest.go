package pooltest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"rmem/pool"
	"rmem/pool/coord"
)

// Clock is a fake clock. Its zero value starts at 2026-01-01 UTC.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Now implements coord.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		c.now = epoch
	}
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	now := c.Now()
	c.mu.Lock()
	c.now = now.Add(d)
	c.mu.Unlock()
}

// Servers is a set of in-memory memory servers. The zero value is ready.
type Servers struct {
	mu      sync.Mutex
	servers map[pool.ServerID]*Server
}

var _ coord.Dialer = (*Servers)(nil)

// Server is one in-memory memory server.
type Server struct {
	ID       pool.ServerID
	mu       sync.Mutex
	instance string
	keys     map[pool.SlabIndex]pool.Key
	zeroed   map[pool.SlabIndex]int // times each slab was zeroed
	failNext error                  // returned by every call while set
	blocked  <-chan struct{}        // Free waits for it to close, while set
	epoch    uint64                 // newest leader epoch granted for
	calls    int
}

var _ coord.SlabServer = (*Server)(nil)

// Add creates a server and returns its registration (slabs of slabSize).
func (ss *Servers) Add(id pool.ServerID, slabs int, slabSize uint64, domain string) pool.ServerInfo {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.servers == nil {
		ss.servers = map[pool.ServerID]*Server{}
	}
	s := &Server{ID: id, instance: pool.RandomHex(8), keys: map[pool.SlabIndex]pool.Key{}, zeroed: map[pool.SlabIndex]int{}}
	ss.servers[id] = s
	return pool.ServerInfo{ID: id, Instance: s.instance, Domain: domain, SlabSize: slabSize, Slabs: slabs,
		Addrs: map[string]string{"mem": string(id)}, ControlURL: "pooltest://" + string(id)}
}

// Get returns a server added before.
func (ss *Servers) Get(id pool.ServerID) *Server {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.servers[id]
}

// SlabServer implements coord.Dialer.
func (ss *Servers) SlabServer(info *pool.ServerInfo) (coord.SlabServer, error) {
	if s := ss.Get(info.ID); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("pooltest: no server %q", info.ID)
}

// Restart gives the server a new instance: every key is gone.
func (s *Server) Restart() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.instance = pool.RandomHex(8)
	clear(s.keys)
	return s.instance
}

// Fail makes every later call fail with err (nil: succeed again).
func (s *Server) Fail(err error) {
	s.mu.Lock()
	s.failNext = err
	s.mu.Unlock()
}

// Block makes later Free calls wait until release is closed or their
// context ends, as calls to a stopped server do (nil: answer at once).
func (s *Server) Block(release <-chan struct{}) {
	s.mu.Lock()
	s.blocked = release
	s.mu.Unlock()
}

// Keys returns the live keys by slab index.
func (s *Server) Keys() map[pool.SlabIndex]pool.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[pool.SlabIndex]pool.Key, len(s.keys))
	for k, v := range s.keys {
		out[k] = v
	}
	return out
}

// Zeroed returns how many times slab i was zeroed.
func (s *Server) Zeroed(i pool.SlabIndex) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.zeroed[i]
}

// Calls returns the number of Grant and Free calls.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Grant implements coord.SlabServer.
func (s *Server) Grant(ctx context.Context, instance string, epoch uint64, idx []pool.SlabIndex) ([]pool.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.failNext != nil {
		return nil, s.failNext
	}
	if instance != s.instance {
		return nil, fmt.Errorf("%w: %s is instance %s", pool.ErrStaleInstance, s.ID, s.instance)
	}
	if epoch < s.epoch {
		return nil, fmt.Errorf("%w: epoch %d, granted for %d already", pool.ErrStaleLeader, epoch, s.epoch)
	}
	s.epoch = epoch
	keys := make([]pool.Key, len(idx))
	for i, x := range idx {
		if _, ok := s.keys[x]; ok {
			s.zeroed[x]++ // revoke + zero before reuse
		}
		keys[i] = pool.Key(pool.RandomHex(16))
		s.keys[x] = keys[i]
	}
	return keys, nil
}

var _ coord.InstanceProber = (*Server)(nil)

// ProbeInstance implements coord.InstanceProber: the instance running now
// (a Restart changes it), or the error set by Fail.
func (s *Server) ProbeInstance(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failNext != nil {
		return "", s.failNext
	}
	return s.instance, nil
}

// Free implements coord.SlabServer.
func (s *Server) Free(ctx context.Context, instance string, slabs []pool.FreeEntry) error {
	s.mu.Lock()
	if b := s.blocked; b != nil {
		s.mu.Unlock()
		select {
		case <-b:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	s.calls++
	if s.failNext != nil {
		return s.failNext
	}
	if instance != s.instance {
		return nil
	}
	for _, e := range slabs {
		if k, ok := s.keys[e.Index]; ok && k == e.Key {
			delete(s.keys, e.Index)
			s.zeroed[e.Index]++
		}
	}
	return nil
}
