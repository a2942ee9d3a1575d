package memserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"rmem/pool"
	"rmem/rdma"
)

// Options configure a Server.
type Options struct {
	ID       pool.ServerID
	Capacity uint64 // bytes; a positive multiple of SlabSize
	SlabSize uint64 // a positive multiple of 2 MiB
	// Listen maps rdma provider names to listen addresses, e.g.
	// {"tcp": "127.0.0.1:7471", "shm": "/run/rmem/memd-data.sock"}.
	Listen map[string]string
	// Advertise overrides the address registered for a provider (e.g. the
	// host's public address when listening on 0.0.0.0).
	Advertise map[string]string
	// Optional lists providers whose listener may fail (provider not built
	// in): the server then runs without them and logs why.
	Optional   map[string]bool
	ControlURL string // this server's control endpoint, for the coordinator
	Domain     string
	Labels     map[string]string
	// NoLock skips mlock (tests on machines with a small RLIMIT_MEMLOCK).
	NoLock bool
	// NoHugeTLB never tries hugetlbfs pages.
	NoHugeTLB bool
	Log       *zap.Logger
	// ListenTLS, when set, is passed to the listeners (tcp).
	ListenOptions rdma.ListenOptions
}

// ErrOptions is wrapped by errors about Options.
var ErrOptions = errors.New("memserver: invalid options")

const twoMiB = 2 << 20

func (o *Options) validate() error {
	switch {
	case o.ID == "":
		return fmt.Errorf("%w: empty ID", ErrOptions)
	case o.SlabSize == 0 || o.SlabSize%twoMiB != 0:
		return fmt.Errorf("%w: slab size %d is not a positive multiple of 2 MiB", ErrOptions, o.SlabSize)
	case o.Capacity == 0 || o.Capacity%o.SlabSize != 0:
		return fmt.Errorf("%w: capacity %d is not a positive multiple of the slab size %d", ErrOptions, o.Capacity, o.SlabSize)
	case len(o.Listen) == 0:
		return fmt.Errorf("%w: no data-plane listener", ErrOptions)
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return nil
}

// Server is a running memory server.
type Server struct {
	opts      Options
	instance  string
	secret    string // pool.ServerInfo.ControlSecret
	region    *rdma.Region
	domain    *rdma.Domain
	listeners []rdma.Listener
	addrs     map[string]string
	backing   string

	mu    sync.Mutex
	keys  []rdma.Key   // by slab index; zero: not granted
	live  atomic.Int64 // granted slabs; read without mu by heartbeats
	close bool
	epoch uint64 // the newest coordinator leader's epoch granted for

	hbMu     sync.Mutex // guards lastOps, lastTime: heartbeats never wait behind zeroing
	lastOps  uint64
	lastTime time.Time
}

// New checks that the memory is available, allocates and locks it,
// registers it with a fresh rdma domain and starts the listeners.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := CheckMemory(opts.Capacity, !opts.NoLock); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, instance: pool.RandomHex(8), secret: pool.RandomHex(32), keys: make([]rdma.Key, opts.Capacity/opts.SlabSize), addrs: map[string]string{}}
	if err := s.alloc(); err != nil {
		return nil, err
	}
	s.domain = rdma.NewDomain(rdma.DomainOptions{})
	if err := s.domain.Register(s.region); err != nil {
		s.region.Close()
		return nil, err
	}
	names := make([]string, 0, len(opts.Listen))
	for n := range opts.Listen {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		l, err := rdma.Listen(n, opts.Listen[n], s.domain, opts.ListenOptions)
		if err != nil {
			if opts.Optional[n] {
				opts.Log.Warn("data-plane listener not started", zap.String("provider", n), zap.Error(err))
				continue
			}
			s.Close()
			return nil, fmt.Errorf("memserver: %s listener on %s: %w", n, opts.Listen[n], err)
		}
		if n == "shm" {
			// The shm provider hands clients the region's memfd: only
			// root (the memagent) may connect.
			if err := os.Chmod(l.Addr(), 0o600); err != nil {
				l.Close()
				s.Close()
				return nil, fmt.Errorf("memserver: shm socket %s: %w", l.Addr(), err)
			}
		}
		s.listeners = append(s.listeners, l)
		s.addrs[n] = l.Addr()
		if a := opts.Advertise[n]; a != "" {
			s.addrs[n] = a
		}
	}
	if len(s.addrs) == 0 {
		s.Close()
		return nil, fmt.Errorf("memserver: no data-plane listener could start")
	}
	s.lastTime = time.Now()
	opts.Log.Info("memory server ready", zap.String("id", string(opts.ID)), zap.String("instance", s.instance),
		zap.Uint64("capacity", opts.Capacity), zap.Int("slabs", len(s.keys)), zap.String("backing", s.backing), zap.Any("addrs", s.addrs))
	return s, nil
}

// alloc allocates the region: hugetlbfs pages if enough are free, else
// THP-advised normal pages.
func (s *Server) alloc() error {
	size := int64(s.opts.Capacity)
	lock := !s.opts.NoLock
	if !s.opts.NoHugeTLB {
		if mi, err := ReadMemInfo(); err == nil && mi.HugePageSize == twoMiB && mi.HugePagesFree*twoMiB >= s.opts.Capacity {
			r, err := rdma.AllocRegion(size, rdma.RegionOptions{Name: "memd-slabs", HugeTLB: true, Lock: lock})
			if err == nil {
				s.region, s.backing = r, "hugetlb"
				return nil
			}
			s.opts.Log.Info("hugetlbfs pages not usable, using THP", zap.Error(err))
		}
	}
	r, err := rdma.AllocRegion(size, rdma.RegionOptions{Name: "memd-slabs", THP: true, Lock: lock})
	if err != nil {
		if lock {
			return fmt.Errorf("%w: allocating and locking %d bytes (check RLIMIT_MEMLOCK and free memory): %w", ErrMemory, size, err)
		}
		return fmt.Errorf("%w: allocating %d bytes: %w", ErrMemory, size, err)
	}
	s.region, s.backing = r, "thp"
	return nil
}

// Instance returns this process's instance id.
func (s *Server) Instance() string { return s.instance }

// Info returns the registration of this server.
func (s *Server) Info() pool.ServerInfo {
	addrs := make(map[string]string, len(s.addrs))
	for k, v := range s.addrs {
		addrs[k] = v
	}
	return pool.ServerInfo{
		ID: s.opts.ID, Instance: s.instance, Domain: s.opts.Domain, Labels: s.opts.Labels, Addrs: addrs,
		ControlURL: s.opts.ControlURL, SlabSize: s.opts.SlabSize, Slabs: len(s.keys),
	}
}

// Registration is Info with the control secret: what the server sends the
// coordinator when it registers, and nobody else.
func (s *Server) Registration() pool.ServerInfo {
	info := s.Info()
	info.ControlSecret = s.secret
	return info
}

// Domain returns the rdma domain (for statistics).
func (s *Server) Domain() *rdma.Domain { return s.domain }

func (s *Server) slab(i pool.SlabIndex) []byte {
	off := uint64(i) * s.opts.SlabSize
	return s.region.Bytes()[off : off+s.opts.SlabSize]
}

// revokeAndZeroLocked revokes slab i's key and zeroes it.
func (s *Server) revokeAndZeroLocked(ctx context.Context, i pool.SlabIndex) error {
	if err := s.domain.Revoke(ctx, s.keys[i]); err != nil && !errors.Is(err, rdma.ErrUnknownKey) {
		return fmt.Errorf("memserver: revoke slab %d: %w", i, err)
	}
	s.keys[i] = rdma.Key{}
	s.live.Add(-1)
	clear(s.slab(i))
	return nil
}

// Grant issues a read/write key for each slab (see coord.SlabServer).
func (s *Server) Grant(ctx context.Context, instance string, epoch uint64, idx []pool.SlabIndex) ([]pool.Key, error) {
	if instance != s.instance {
		return nil, fmt.Errorf("%w: this server is instance %s, not %s", pool.ErrStaleInstance, s.instance, instance)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.close {
		return nil, fmt.Errorf("memserver: %w", rdma.ErrClosed)
	}
	if epoch < s.epoch {
		// A deposed leader (its grant delayed past its successor's) must
		// not revoke the successor's keys.
		return nil, fmt.Errorf("%w: grant for leader epoch %d, this server has granted for epoch %d", pool.ErrStaleLeader, epoch, s.epoch)
	}
	for n, i := range idx {
		if int(i) >= len(s.keys) {
			return nil, &pool.FieldError{Field: "indexes", Msg: fmt.Sprintf("slab %d out of range (%d slabs)", i, len(s.keys))}
		}
		if slices.Contains(idx[:n], i) {
			return nil, &pool.FieldError{Field: "indexes", Msg: fmt.Sprintf("slab %d listed twice", i)}
		}
	}
	out := make([]pool.Key, len(idx))
	for n, i := range idx {
		if !s.keys[i].IsZero() {
			if err := s.revokeAndZeroLocked(ctx, i); err != nil {
				return nil, err
			}
		}
		k, err := s.domain.IssueKey(s.region, uint64(i)*s.opts.SlabSize, s.opts.SlabSize, rdma.AccessReadWrite)
		if err != nil {
			return nil, fmt.Errorf("memserver: issue key for slab %d: %w", i, err)
		}
		s.keys[i] = k
		s.live.Add(1)
		out[n] = pool.Key(k.String())
	}
	s.epoch = epoch
	return out, nil
}

// Free revokes keys and zeroes their slabs (see coord.SlabServer). An entry
// whose key is not the slab's current key is skipped: the slab was freed
// already, or granted again since.
func (s *Server) Free(ctx context.Context, instance string, entries []pool.FreeEntry) error {
	if instance != s.instance {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.close { // its memory is gone: nothing to zero (a Free once closed panicked)
		return fmt.Errorf("memserver: %w", rdma.ErrClosed)
	}
	for _, e := range entries {
		if int(e.Index) >= len(s.keys) {
			return &pool.FieldError{Field: "slabs", Msg: fmt.Sprintf("slab %d out of range (%d slabs)", e.Index, len(s.keys))}
		}
		k, err := rdma.ParseKey(string(e.Key))
		if err != nil {
			return &pool.FieldError{Field: "slabs", Msg: err.Error()}
		}
		if s.keys[e.Index] != k || k.IsZero() {
			continue
		}
		if err := s.revokeAndZeroLocked(ctx, e.Index); err != nil {
			return err
		}
	}
	return nil
}

// Heartbeat returns the state to report to the coordinator.
func (s *Server) Heartbeat() pool.Heartbeat {
	st := s.domain.Stats()
	ops := st.Reads + st.Writes + st.CompareSwaps + st.FetchAdds
	s.hbMu.Lock()
	defer s.hbMu.Unlock()
	now := time.Now()
	load := 0.0
	if dt := now.Sub(s.lastTime).Seconds(); dt > 0 {
		load = float64(ops-s.lastOps) / dt
	}
	s.lastOps, s.lastTime = ops, now
	return pool.Heartbeat{Instance: s.instance, Granted: int(s.live.Load()), Load: load}
}

// Close stops the listeners, revokes every key and frees the memory. It is
// safe to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.close {
		s.mu.Unlock()
		return nil
	}
	s.close = true
	s.mu.Unlock()
	var errs []error
	for _, l := range s.listeners {
		errs = append(errs, l.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs = append(errs, s.domain.Deregister(ctx, s.region))
	errs = append(errs, s.region.Close())
	return errors.Join(errs...)
}
