package coord

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/store"
)

// Clock tells the time. Tests pass a fake one (pool/pooltest.Clock) and call
// Tick themselves.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// SlabServer is what the coordinator needs from a memory server.
//
// Grant issues a fresh read/write key for each index (in order) on the
// server instance named; a slab that already has a key has it revoked and
// is zeroed first. It fails with pool.ErrStaleInstance if the server is
// another instance, and with pool.ErrStaleLeader if epoch (the leader's
// term, see pool.GrantRequest) is older than one it granted for already. Free revokes each key and zeroes its slab; an entry
// whose key is not the slab's current key is skipped without error (freed
// already, or granted again since: never zero another tenant's slab), and a
// request for another instance does nothing. Both must be safe for
// concurrent use.
type SlabServer interface {
	Grant(ctx context.Context, instance string, epoch uint64, indexes []pool.SlabIndex) ([]pool.Key, error)
	Free(ctx context.Context, instance string, slabs []pool.FreeEntry) error
}

// InstanceProber is optionally implemented by a SlabServer
// (pool/client.MemServer): it asks the server at the registered control
// URL which instance answers there. Register uses it to tell a restarted
// server from a second node using the same id.
type InstanceProber interface {
	ProbeInstance(ctx context.Context) (string, error)
}

// Dialer returns the SlabServer of a registered server (in-process for the
// server in the coordinator's own process, HTTP for others).
type Dialer interface {
	SlabServer(info *pool.ServerInfo) (SlabServer, error)
}

// DialerFunc adapts a function to Dialer.
type DialerFunc func(info *pool.ServerInfo) (SlabServer, error)

// SlabServer implements Dialer.
func (f DialerFunc) SlabServer(info *pool.ServerInfo) (SlabServer, error) { return f(info) }

// Term is the leadership a coordinator serves under when several share a
// store (etcd; pool/coord/elect implements it). The coordinator answers
// requests, sweeps and grants only while Valid returns nil; its store must
// be fenced on the same term (store.Etcd.Fenced), so that a write after
// the term ended fails with store.ErrFenced, which the coordinator reports
// to Lost.
type Term interface {
	// Valid returns nil while the term leads, else an error wrapping
	// pool.ErrNotLeader.
	Valid() error
	// Epoch is the term's fencing token for memory servers
	// (pool.GrantRequest.Epoch): larger for every later term.
	Epoch() uint64
	// Lost ends the term: the store found it fenced off.
	Lost(err error)
}

// Options configure a Coordinator.
type Options struct {
	Store store.Store // required; the caller closes it after the coordinator stops
	// Term is the leadership this coordinator acts under; nil: it is the
	// pool's only coordinator (bbolt, in memory), always leading.
	Term   Term
	Dialer Dialer // required
	// SlabSize is the pool's slab size; servers registering another size
	// are refused. Required.
	SlabSize uint64
	// HeartbeatTimeout marks a server dead when it has not heartbeated for
	// this long (default 10s).
	HeartbeatTimeout time.Duration
	// Redundancy is the pool's default for agents that choose none
	// (pool.ParseRedundancy; empty: theirs). Status shows it.
	Redundancy string
	// CallTimeout bounds each Grant or Free call to a server (default 10s).
	CallTimeout time.Duration
	Clock       Clock                // default: the real clock
	Log         *zap.Logger          // default: no logging
	Registry    *prometheus.Registry // default: a new private registry
	Seed        uint64               // placement randomness; 0: random
}

// ErrOptions is wrapped by errors about Options.
var ErrOptions = errors.New("coord: invalid options")

func (o *Options) validate() error {
	if o.Redundancy != "" {
		if _, err := pool.ParseRedundancy(o.Redundancy); err != nil {
			return fmt.Errorf("%w: %w", ErrOptions, err)
		}
	}
	switch {
	case o.Store == nil:
		return fmt.Errorf("%w: Store is nil", ErrOptions)
	case o.Dialer == nil:
		return fmt.Errorf("%w: Dialer is nil", ErrOptions)
	case o.SlabSize == 0 || o.SlabSize%4096 != 0:
		return fmt.Errorf("%w: SlabSize %d is not a positive multiple of 4096", ErrOptions, o.SlabSize)
	case o.HeartbeatTimeout < 0 || o.CallTimeout < 0:
		return fmt.Errorf("%w: negative timeout", ErrOptions)
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = 10 * time.Second
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		for _, x := range b {
			o.Seed = o.Seed<<8 | uint64(x)
		}
	}
	return nil
}

// srv is a server's state. Its used bitmap counts slabs held by replicas of
// the current instance, reserved by an allocation in flight, or waiting for
// the server to confirm a free.
type srv struct {
	rec    pool.Server
	used   []bool
	nused  int
	cursor int
	lastHB time.Time
	hb     pool.Heartbeat
	conn   SlabServer // dialled lazily, reset on registration
	// heard: the server registered or heartbeated since this coordinator
	// loaded its state; until then the views say "unknown", not "up".
	heard bool
	// Frees to this server failing since freeFailSince (zero: none),
	// freeFails times; freeFailSaid is when the log last said so.
	freeFailSince, freeFailSaid time.Time
	freeFails                   int
}

func (s *srv) free() int { return s.rec.Slabs - s.nused }

func (s *srv) takeLocked() pool.SlabIndex {
	for n := 0; n < len(s.used); n++ {
		i := (s.cursor + n) % len(s.used)
		if !s.used[i] {
			s.used[i] = true
			s.nused++
			s.cursor = i + 1
			return pool.SlabIndex(i)
		}
	}
	panic("coord: takeLocked on a full server") // placement respects free()
}

func (s *srv) markLocked(i pool.SlabIndex) {
	if int(i) < len(s.used) && !s.used[i] {
		s.used[i] = true
		s.nused++
	}
}

func (s *srv) releaseLocked(i pool.SlabIndex) {
	if int(i) < len(s.used) && s.used[i] {
		s.used[i] = false
		s.nused--
	}
}

type lease struct {
	rec    pool.Lease // Secret is never set here
	secret string     // hex SHA-256 of the lease's secret; "" for leases of older coordinators
	slabs  map[pool.SlabID]*pool.Slab
	report pool.RenewRequest // the agent's last (not persisted)
}

// extendFrom gives l a whole TTL from now, unless it has longer already:
// what a lease gets when its renewals could not have come in (the
// coordinator restarted, or stood still).
func (l *lease) extendFrom(now time.Time) {
	if exp := now.Add(l.rec.TTL.Std()); exp.After(l.rec.Expires) {
		l.rec.Expires = exp
	}
}

// freeJob asks one server instance to free slabs.
type freeJob struct {
	server   pool.ServerID
	instance string
	entries  []pool.FreeEntry
}

// Coordinator is the pool coordinator service. Create it with New.
type Coordinator struct {
	opts  Options
	log   *zap.Logger
	clock Clock
	m     *metrics

	mu       sync.Mutex
	servers  map[pool.ServerID]*srv
	srvList  []*srv // the same servers, in registration order (fast scans)
	leases   map[pool.LeaseID]*lease
	slabs    map[pool.SlabID]*pool.Slab
	nextSlab pool.SlabID
	pending  []freeJob      // frees a server has not confirmed yet
	bg       sync.WaitGroup // frees run behind a request (freeLater); Close waits
	closed   bool           // Close began: freeLater starts nothing more
	rnd      *mrand.Rand
	cands    []pool.Candidate // reused by candidatesLocked
	candSrv  []*srv
	// The sweeper's own pace (Tick): every, as RoutineSweep runs it (0:
	// Tick called by hand); when it last ran; and when it last resumed
	// after a stall of its own, before which no heartbeat counts missed.
	sweepEvery time.Duration
	lastTick   time.Time
	resumed    time.Time
}

// New loads the coordinator's state from opts.Store.
func New(opts Options) (*Coordinator, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Term != nil {
		opts.Store = termStore{opts.Store, opts.Term}
	}
	c := &Coordinator{
		opts: opts, log: opts.Log, clock: opts.Clock,
		servers:  map[pool.ServerID]*srv{},
		leases:   map[pool.LeaseID]*lease{},
		slabs:    map[pool.SlabID]*pool.Slab{},
		nextSlab: 1,
		rnd:      mrand.New(mrand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	m, err := newMetrics(c, opts.Registry)
	if err != nil {
		return nil, err
	}
	c.m = m
	return c, nil
}

// termStore reports fenced writes to the term.
type termStore struct {
	store.Store
	term Term
}

func (s termStore) Update(fn func(store.Tx) error) error {
	err := s.Store.Update(fn)
	if errors.Is(err, store.ErrFenced) {
		s.term.Lost(err)
		err = fmt.Errorf("%w: %w", pool.ErrNotLeader, err)
	}
	return err
}

// Leading returns nil while this coordinator may act (see Term), else an
// error wrapping pool.ErrNotLeader.
func (c *Coordinator) Leading() error {
	if c.opts.Term == nil {
		return nil
	}
	return c.opts.Term.Valid()
}

func (c *Coordinator) epoch() uint64 {
	if c.opts.Term == nil {
		return 0
	}
	return c.opts.Term.Epoch()
}

// Registry returns the coordinator's Prometheus registry.
func (c *Coordinator) Registry() *prometheus.Registry { return c.opts.Registry }

// SlabSize returns the pool's slab size.
func (c *Coordinator) SlabSize() uint64 { return c.opts.SlabSize }

// RoutineSweep sweeps every interval (dead servers, expired leases, retried frees)
// until ctx is done. It is the coordinator's only long-running goroutine.
func (c *Coordinator) RoutineSweep(ctx context.Context, interval time.Duration) {
	c.mu.Lock()
	c.sweepEvery = interval
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.sweepEvery = 0 // no pace kept from now on: nothing to call a stall
		c.mu.Unlock()
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Tick(ctx)
		}
	}
}

func newID() pool.LeaseID { return pool.LeaseID(pool.RandomHex(12)) }

func hashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// CheckLeaseSecret returns an error wrapping pool.ErrForbidden unless
// secret is lease id's (a lease created by a coordinator before lease
// secrets existed takes any). An unknown lease passes: the request itself
// then answers that it does not exist.
func (c *Coordinator) CheckLeaseSecret(id pool.LeaseID, secret string) error {
	c.mu.Lock()
	l := c.leases[id]
	c.mu.Unlock()
	if l == nil || l.secret == "" {
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(hashSecret(secret)), []byte(l.secret)) != 1 {
		if secret == "" {
			return fmt.Errorf("%w: lease %q: the request has no %s header (only the agent holding the lease may use it)", pool.ErrForbidden, id, pool.LeaseSecretHeader)
		}
		return fmt.Errorf("%w: lease %q: wrong %s", pool.ErrForbidden, id, pool.LeaseSecretHeader)
	}
	return nil
}

// getSrvLocked returns the server's record or nil.
func (c *Coordinator) getSrvLocked(id pool.ServerID) *pool.Server {
	if s := c.servers[id]; s != nil {
		return &s.rec
	}
	return nil
}

// rebuildUsedLocked recomputes s.used from the replicas of its current
// instance and the pending frees of that instance.
func (c *Coordinator) rebuildUsedLocked(s *srv) {
	s.used = make([]bool, s.rec.Slabs)
	s.nused, s.cursor = 0, 0
	for _, sl := range c.slabs {
		for _, r := range sl.Replicas {
			if r.Server == s.rec.ID && r.Instance == s.rec.Instance {
				s.markLocked(r.Index)
			}
		}
	}
	for _, j := range c.pending {
		if j.server == s.rec.ID && j.instance == s.rec.Instance {
			for _, e := range j.entries {
				s.markLocked(e.Index)
			}
		}
	}
}

// liveLeaseLocked returns the lease id if it exists and has not expired
// (after a stall of this process, resumeLocked: not of the stall).
func (c *Coordinator) liveLeaseLocked(id pool.LeaseID, now time.Time) (*lease, error) {
	c.resumeLocked(now)
	l := c.leases[id]
	if l == nil {
		return nil, fmt.Errorf("%w: lease %q", pool.ErrNotFound, id)
	}
	if !l.rec.Expires.After(now) {
		return nil, fmt.Errorf("%w: lease %q expired at %s", pool.ErrLeaseExpired, id, l.rec.Expires.Format(time.RFC3339Nano))
	}
	return l, nil
}

// slabOfLocked returns the slab if it belongs to the live lease.
func (c *Coordinator) slabOfLocked(id pool.LeaseID, sid pool.SlabID, now time.Time) (*lease, *pool.Slab, error) {
	l, err := c.liveLeaseLocked(id, now)
	if err != nil {
		return nil, nil, err
	}
	sl := l.slabs[sid]
	if sl == nil {
		return nil, nil, fmt.Errorf("%w: slab %d in lease %q", pool.ErrNotFound, sid, id)
	}
	return l, sl, nil
}
