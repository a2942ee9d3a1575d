package poolstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"rmem/pager/remote"
	"rmem/pager/slabio"
	"rmem/pool"
	"rmem/rdma"
)

var _ remote.Store = (*Store)(nil)

// Pool is the coordinator as the Store uses it; *pool/client.Client
// implements it.
type Pool interface {
	Status(ctx context.Context) (pool.Status, error)
	CreateLease(ctx context.Context, req pool.CreateLeaseRequest) (pool.Lease, error)
	Allocate(ctx context.Context, id pool.LeaseID, req pool.AllocateRequest) ([]pool.SlabView, error)
	Renew(ctx context.Context, id pool.LeaseID, req pool.RenewRequest) (pool.RenewResponse, error)
	Replace(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) (pool.ReplicaView, error)
	Migrated(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) error
	FreeSlab(ctx context.Context, id pool.LeaseID, sid pool.SlabID) error
	DeleteLease(ctx context.Context, id pool.LeaseID) error
	LeaseSlabs(ctx context.Context, id pool.LeaseID) ([]pool.SlabView, error)
}

// ErrOptions: invalid Options (the error names the field).
var ErrOptions = errors.New("poolstore: invalid options")

// Options configure a Store.
type Options struct {
	Pool     Pool   // required
	Agent    string // lease agent name, e.g. "memagent@node-a"; required
	Node     string
	PID      int
	TTL      time.Duration // lease TTL (default 30s)
	Replicas int           // replicas per slab, 1..8 (default 1); Redundancy wins if set
	// Redundancy, when set, is how pages are kept: rep:N (Replicas N) or
	// ec:K+M, erasure-coded slabs (slabio.PutGroup) of K+M shards, each a
	// replica of one pool slab on a server of its own.
	Redundancy pool.Redundancy
	Network    string           // rdma provider used to reach servers (default "tcp")
	Dial       rdma.DialOptions // for every connection (Depth bounds a batch)
	Log        *zap.Logger
	// Adopt, when set, is a lease of a previous agent of this node (one
	// that was killed or restarted): Open takes it over, with its slabs,
	// if it is still alive, and creates a new one otherwise (Adopted says
	// which).
	Adopt pool.LeaseID
	// AdoptSecret is Adopt's secret (pool.Lease.Secret), handed to Pool
	// when it keeps secrets (SetLeaseSecret): the coordinator refuses a
	// lease's requests without it.
	AdoptSecret string
	// SumDir, when set, keeps the pages' checksums in files there, one per
	// slab (slabio.Table.PersistSums), so that the agent that adopts the
	// lease after this one checks the pages written before it.
	SumDir string
}

// secretKeeper is a Pool that sends each lease's secret with its requests
// (pool/client.Client).
type secretKeeper interface {
	SetLeaseSecret(id pool.LeaseID, secret string)
}

// Validate checks the options, naming the bad field.
func (o *Options) Validate() error {
	switch {
	case o.Pool == nil:
		return fmt.Errorf("%w: Pool is required", ErrOptions)
	case o.Agent == "":
		return fmt.Errorf("%w: Agent is required", ErrOptions)
	case o.TTL < 0 || (o.TTL > 0 && o.TTL < 100*time.Millisecond):
		return fmt.Errorf("%w: TTL %v: want at least 100ms", ErrOptions, o.TTL)
	case o.Replicas < 0 || o.Replicas > 8:
		return fmt.Errorf("%w: Replicas %d: want 1..8", ErrOptions, o.Replicas)
	case o.Redundancy.Servers() > pool.MaxReplicas || o.Redundancy.Copies < 0 || o.Redundancy.K < 0 || o.Redundancy.M < 0:
		return fmt.Errorf("%w: Redundancy %s: at most %d servers a slab", ErrOptions, o.Redundancy, pool.MaxReplicas)
	}
	if err := o.Dial.Validate(); err != nil {
		return fmt.Errorf("%w: Dial: %w", ErrOptions, err)
	}
	return nil
}

// Stats counts the Store's control-plane work.
type Stats struct {
	Slabs      int    // slabs held
	Allocated  uint64 // slabs allocated in total
	Freed      uint64
	Renewals   uint64
	Migrations uint64 // replicas copied to a replacement and reported
	MigrateErr uint64 // failed attempts (retried at the next renewal)
	slabio.Stats
}

// Store is a remote.Store over the pool.
type Store struct {
	opts  Options
	lease pool.Lease
	table *slabio.Table
	log   *zap.Logger

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	usage        atomic.Pointer[func() pool.RenewRequest] // what renewals report (SetUsage)
	failingSince time.Time                                // renewals fail since (RoutineRenew's)
	failSaid     time.Time

	allocated, freed, renewals, migrations, migrateErr atomic.Uint64
	adopted                                            bool

	striped atomic.Bool // the last Alloc fell back from ec to copies

	// parts: the pool slabs of each unit of Layout "stripe:K" (by the
	// table's id for it), and the table shard each is.
	partsMu sync.Mutex
	parts   map[remote.SlabID][]pool.SlabID
	partOf  map[pool.SlabID]remote.SlabID

	lostMu   sync.Mutex
	lostSaid map[remote.SlabID]bool // slabs whose loss was logged (once each: a job per lost replica)
}

// Open creates a lease and starts renewing it.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.TTL == 0 {
		opts.TTL = 30 * time.Second
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Redundancy == (pool.Redundancy{}) {
		opts.Redundancy = pool.Redundancy{Copies: opts.Replicas}
	}
	if opts.Network == "" {
		opts.Network = "tcp"
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	st, err := opts.Pool.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("poolstore: pool status: %w", err)
	}
	if st.SlabSize == 0 || st.SlabSize%4096 != 0 {
		return nil, fmt.Errorf("poolstore: pool slab size %d is not a multiple of 4096", st.SlabSize)
	}
	s := &Store{opts: opts, table: slabio.NewTable(st.SlabSize, opts.Dial), done: make(chan struct{}),
		parts: map[remote.SlabID][]pool.SlabID{}, partOf: map[pool.SlabID]remote.SlabID{}}
	if opts.SumDir != "" {
		s.table.PersistSums(opts.SumDir)
	}
	log := opts.Log
	s.table.OnCorrupt(func(id remote.SlabID, server string, off uint64) {
		// Once per slab and server: the page was read from another
		// replica and written back to all, or, with no good copy, lost.
		log.Warn("a page read from a memory server failed its checksum", zap.Uint64("slab", uint64(id)),
			zap.String("server", server), zap.Uint64("offset", off))
	})
	if opts.Adopt != "" {
		if sk, ok := opts.Pool.(secretKeeper); ok && opts.AdoptSecret != "" {
			sk.SetLeaseSecret(opts.Adopt, opts.AdoptSecret)
		}
		err = s.adopt(ctx, opts.Adopt)
		switch {
		case err == nil:
			s.adopted = true
		case errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrLeaseExpired):
			opts.Log.Warn("the previous agent's lease is gone: the pages it held are lost to its programs", zap.String("lease", string(opts.Adopt)))
		default:
			return nil, fmt.Errorf("poolstore: take over lease %s: %w", opts.Adopt, err)
		}
	}
	if !s.adopted {
		lease, err := opts.Pool.CreateLease(ctx, pool.CreateLeaseRequest{
			Agent: opts.Agent, Node: opts.Node, PID: opts.PID, TTL: pool.Duration(opts.TTL),
		})
		if err != nil {
			return nil, fmt.Errorf("poolstore: create lease: %w", err)
		}
		s.lease = lease
	}
	s.log = opts.Log.With(zap.String("lease", string(s.lease.ID)))
	rctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.RoutineRenew(rctx)
	return s, nil
}

// adopt takes over lease id: renews it and puts its slabs in the table.
func (s *Store) adopt(ctx context.Context, id pool.LeaseID) error {
	resp, err := s.opts.Pool.Renew(ctx, id, pool.RenewRequest{})
	if err != nil {
		return err
	}
	views, err := s.opts.Pool.LeaseSlabs(ctx, id)
	if err != nil {
		return err
	}
	if _, err := s.put(views, true); err != nil {
		return fmt.Errorf("poolstore: lease %s: %w", id, err)
	}
	s.lease = resp.Lease
	s.opts.Log.Info("took over the previous agent's lease", zap.String("lease", string(id)), zap.Int("slabs", len(views)))
	return nil
}

// Adopted reports whether Open took over the lease of Options.Adopt.
func (s *Store) Adopted() bool { return s.adopted }

// Slabs returns the slabs the Store holds (its lease's).
func (s *Store) Slabs() []remote.SlabID { return s.table.IDs() }

// Lease returns the lease the Store holds.
func (s *Store) Lease() pool.Lease { return s.lease }

// Table returns the slab table.
func (s *Store) Table() *slabio.Table { return s.table }

// Layout returns how the servers keep slab id (slabio.Table.Layout).
func (s *Store) Layout(id remote.SlabID) (copies, k, m int) { return s.table.Layout(id) }

// SlabSize implements remote.Store: a pool slab, or K of them under
// ec:K+M (a group's data shards).
func (s *Store) SlabSize() uint64 {
	if s.opts.Redundancy.EC() {
		return s.table.SlabSize() * uint64(s.opts.Redundancy.K)
	}
	return s.table.SlabSize()
}

// Redundancy returns how the Store keeps pages.
func (s *Store) Redundancy() pool.Redundancy { return s.opts.Redundancy }

// layout is the pool's Layout of the Store's slabs.
func (s *Store) layout() string {
	if s.opts.Redundancy.EC() {
		return s.opts.Redundancy.String()
	}
	return ""
}

// shards returns the shards of an erasure-coded slab's view: shard i's
// replicas (one, or two while it is replaced).
func (s *Store) shards(v pool.SlabView) ([][]slabio.Replica, error) {
	n := s.opts.Redundancy.K + s.opts.Redundancy.M
	shards := make([][]slabio.Replica, n)
	for _, rv := range v.Replicas {
		if rv.Shard < 0 || rv.Shard >= n {
			return nil, fmt.Errorf("poolstore: slab %d: replica on %s is shard %d of %d", v.ID, rv.Server, rv.Shard, n)
		}
		r, err := s.replica(rv)
		if err != nil {
			return nil, err
		}
		shards[rv.Shard] = append(shards[rv.Shard], r)
	}
	for i, sh := range shards {
		if len(sh) == 0 {
			return nil, fmt.Errorf("poolstore: slab %d has no shard %d", v.ID, i)
		}
	}
	return shards, nil
}

// OpenIO implements remote.Store.
func (s *Store) OpenIO() (remote.PageIO, error) { return s.table.NewIO(), nil }

// Alloc implements remote.Store. Under ec:K+M with fewer than K+M
// servers to place a slab's shards on, it falls back to a unit of K pool
// slabs of M+1 copies each (the same tolerance, the same slab size),
// saying so once, and goes back to erasure coding when it can.
func (s *Store) Alloc(ctx context.Context, n int) ([]remote.SlabID, error) {
	red := s.opts.Redundancy
	ids, err := s.alloc(ctx, pool.AllocateRequest{Slabs: n, Replicas: red.Servers(), Layout: s.layout()})
	if !red.EC() {
		return ids, err
	}
	if err == nil {
		if s.striped.Swap(false) {
			s.log.Info("enough memory servers up again: new slabs are erasure-coded", zap.Stringer("redundancy", red))
		}
		return ids, nil
	}
	if !errors.Is(err, remote.ErrFull) {
		return nil, err
	}
	ids, serr := s.alloc(ctx, pool.AllocateRequest{Slabs: n * red.K, Replicas: red.M + 1, Layout: fmt.Sprintf("stripe:%d", red.K)})
	if serr != nil {
		return nil, err
	}
	if !s.striped.Swap(true) {
		s.log.Warn("too few memory servers up for erasure-coded slabs: new slabs are kept as copies, with the same tolerance, until enough are up",
			zap.Stringer("redundancy", red), zap.Int("copies", red.M+1), zap.Error(err))
	}
	return ids, nil
}

// alloc allocates req's slabs and puts them in the table.
func (s *Store) alloc(ctx context.Context, req pool.AllocateRequest) ([]remote.SlabID, error) {
	views, err := s.opts.Pool.Allocate(ctx, s.lease.ID, req)
	if errors.Is(err, pool.ErrNoCapacity) {
		return nil, fmt.Errorf("poolstore: allocate %d slabs: %w (%w)", req.Slabs, remote.ErrFull, err)
	}
	if err != nil {
		return nil, fmt.Errorf("poolstore: allocate %d slabs: %w", req.Slabs, err)
	}
	ids, err := s.put(views, false)
	if err != nil {
		for _, v := range views {
			s.opts.Pool.FreeSlab(ctx, s.lease.ID, v.ID)
		}
		for _, id := range ids {
			s.Forget(id)
		}
		return nil, err
	}
	s.allocated.Add(uint64(len(ids)))
	return ids, nil
}

// put puts the slabs of views in the table (adopt: with the sums kept by
// the agent before) and returns the table's ids: a slab, an erasure-coded
// slab (its shards the slab's replicas), or a unit of K slabs of Layout
// "stripe:K" (named by its first slab).
func (s *Store) put(views []pool.SlabView, adopt bool) ([]remote.SlabID, error) {
	red := s.opts.Redundancy
	warn := func(id pool.SlabID, err error) {
		if err != nil {
			s.opts.Log.Warn("no checksum file for a slab: its pages' checksums are kept in memory only, and pages written before are not checked", zap.Uint64("slab", uint64(id)), zap.Error(err))
		}
	}
	type unit struct {
		reps  [][]slabio.Replica
		parts []pool.SlabID
	}
	units := map[pool.SlabID]*unit{}
	var order []pool.SlabID
	var ids []remote.SlabID
	for _, v := range views {
		if v.Size != s.table.SlabSize() {
			return ids, fmt.Errorf("poolstore: slab %d has size %d, want %d", v.ID, v.Size, s.table.SlabSize())
		}
		k, striped := pool.StripeLayout(v.Layout)
		switch {
		case striped && (!red.EC() || k != red.K || v.Part < 0 || v.Part >= k):
			return ids, fmt.Errorf("poolstore: slab %d is kept as %q (part %d), this agent keeps %s (--redundancy)", v.ID, v.Layout, v.Part, red)
		case striped:
			u := units[v.Group]
			if u == nil {
				u = &unit{reps: make([][]slabio.Replica, k), parts: make([]pool.SlabID, k)}
				units[v.Group] = u
				order = append(order, v.Group)
			}
			reps, err := s.replicas(v.Replicas)
			if err != nil {
				return ids, err
			}
			u.reps[v.Part], u.parts[v.Part] = reps, v.ID
		case v.Layout != s.layout():
			return ids, fmt.Errorf("poolstore: slab %d is kept as %q, this agent keeps %s (--redundancy)", v.ID, v.Layout, red)
		case red.EC():
			shards, err := s.shards(v)
			if err != nil {
				return ids, err
			}
			if adopt {
				err = s.table.AdoptGroup(remote.SlabID(v.ID), red.K, red.M, shards)
			} else {
				err = s.table.PutGroup(remote.SlabID(v.ID), red.K, red.M, shards)
			}
			warn(v.ID, err)
			ids = append(ids, remote.SlabID(v.ID))
		default:
			reps, err := s.replicas(v.Replicas)
			if err != nil {
				return ids, err
			}
			if adopt {
				err = s.table.Adopt(remote.SlabID(v.ID), reps)
			} else {
				err = s.table.Put(remote.SlabID(v.ID), reps)
			}
			warn(v.ID, err)
			ids = append(ids, remote.SlabID(v.ID))
		}
	}
	for _, gid := range order {
		u := units[gid]
		for i, r := range u.reps {
			if r == nil {
				return ids, fmt.Errorf("poolstore: unit %d has no part %d", gid, i)
			}
		}
		id := remote.SlabID(gid)
		s.partsMu.Lock()
		s.parts[id] = u.parts
		for i, p := range u.parts {
			s.partOf[p] = slabio.ShardID(id, i)
		}
		s.partsMu.Unlock()
		var err error
		if adopt {
			err = s.table.AdoptGroup(id, red.K, 0, u.reps)
		} else {
			err = s.table.PutGroup(id, red.K, 0, u.reps)
		}
		warn(gid, err)
		ids = append(ids, id)
	}
	return ids, nil
}

// Forget drops slab id from the table (and a unit's parts from the
// Store's map), without freeing it in the pool; it returns the pool slabs
// it was.
func (s *Store) Forget(id remote.SlabID) []pool.SlabID {
	s.table.Remove(id)
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	parts := s.parts[id]
	if parts == nil {
		return []pool.SlabID{pool.SlabID(id)}
	}
	delete(s.parts, id)
	for _, p := range parts {
		delete(s.partOf, p)
	}
	return parts
}

// poolSlab returns the pool slab that the table's slab or shard id is.
func (s *Store) poolSlab(id remote.SlabID) pool.SlabID {
	gid, i, ok := slabio.ShardOf(id)
	if !ok {
		return pool.SlabID(id)
	}
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if parts := s.parts[gid]; parts != nil {
		return parts[i]
	}
	return pool.SlabID(gid)
}

func (s *Store) replicas(views []pool.ReplicaView) ([]slabio.Replica, error) {
	reps := make([]slabio.Replica, 0, len(views))
	for _, v := range views {
		r, err := s.replica(v)
		if err != nil {
			return nil, err
		}
		reps = append(reps, r)
	}
	return reps, nil
}

func (s *Store) replica(v pool.ReplicaView) (slabio.Replica, error) {
	if v.State == "lost" { // nothing to reach: kept so that Replace can name it
		return slabio.Replica{Server: string(v.Server), Network: s.opts.Network, State: slabio.Lost}, nil
	}
	addr := v.Addrs[s.opts.Network]
	if addr == "" {
		return slabio.Replica{}, fmt.Errorf("poolstore: server %s has no %q address", v.Server, s.opts.Network)
	}
	k, err := rdma.ParseKey(string(v.Key))
	if err != nil {
		return slabio.Replica{}, fmt.Errorf("poolstore: server %s: key: %w", v.Server, err)
	}
	st := slabio.Healthy
	if v.State == "lost" {
		st = slabio.Lost
	}
	return slabio.Replica{Server: string(v.Server), Network: s.opts.Network, Addr: addr, Key: k, State: st}, nil
}

// Free implements remote.Store.
func (s *Store) Free(ctx context.Context, ids []remote.SlabID) error {
	var errs []error
	for _, id := range ids {
		failed := false
		for _, p := range s.Forget(id) {
			if err := s.opts.Pool.FreeSlab(ctx, s.lease.ID, p); err != nil && !errors.Is(err, pool.ErrNotFound) {
				errs = append(errs, fmt.Errorf("poolstore: free slab %d: %w", p, err))
				failed = true
			}
		}
		if !failed {
			s.freed.Add(1)
		}
	}
	return errors.Join(errs...)
}

// SetUsage gives the Store what its renewals report to the pool: the
// bytes of its slabs that hold data, and whether it waits for room.
func (s *Store) SetUsage(f func() pool.RenewRequest) { s.usage.Store(&f) }

// Stats returns the counters.
func (s *Store) Stats() Stats {
	return Stats{
		Slabs: len(s.table.IDs()), Allocated: s.allocated.Load(), Freed: s.freed.Load(),
		Renewals: s.renewals.Load(), Migrations: s.migrations.Load(), MigrateErr: s.migrateErr.Load(),
		Stats: s.table.Stats(),
	}
}

// RoutineRenew renews the lease every TTL/3 until ctx ends, and hands its
// events to a second goroutine that restores redundancy. Open starts it.
// Renewals never wait for repairs: a repair waits on the servers involved
// (a stopped one holds a call for its whole timeout), and a lease not
// renewed in time frees every slab.
func (s *Store) RoutineRenew(ctx context.Context) {
	defer close(s.done)
	events := make(chan []pool.Event, 1)
	repaired := make(chan struct{})
	go func() {
		defer close(repaired)
		s.routineRepair(ctx, events)
	}()
	defer func() { <-repaired }()
	t := time.NewTicker(s.opts.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ev, err := s.renew(ctx)
		if err != nil {
			continue
		}
		select { // the latest events replace those not acted on yet
		case <-events:
		default:
		}
		events <- ev
	}
}

// routineRepair restores redundancy after each renewal's events.
func (s *Store) routineRepair(ctx context.Context, events <-chan []pool.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			s.repair(ctx, ev)
		}
	}
}

// RenewOnce renews the lease and restores redundancy where the pool's
// events or failed WRITEs say it is missing, in turn.
func (s *Store) RenewOnce(ctx context.Context) error {
	ev, err := s.renew(ctx)
	if err != nil {
		return err
	}
	return s.repair(ctx, ev)
}

// renew renews the lease, reporting the agent's usage, and returns the
// pool's events about its slabs.
func (s *Store) renew(ctx context.Context) ([]pool.Event, error) {
	var req pool.RenewRequest
	if f := s.usage.Load(); f != nil {
		req = (*f)()
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.TTL/3)
	resp, err := s.opts.Pool.Renew(rctx, s.lease.ID, req)
	cancel()
	if err != nil {
		// Said when it begins and once a minute while it lasts, not at
		// every try.
		now := time.Now()
		if s.failingSince.IsZero() {
			s.failingSince = now
		}
		if now.Sub(s.failSaid) >= time.Minute {
			s.failSaid = now
			s.log.Warn("lease renewal failed; retrying", zap.Duration("failing_for", now.Sub(s.failingSince).Round(time.Second)),
				zap.Duration("ttl", s.opts.TTL), zap.Error(err))
		}
		return nil, err
	}
	if !s.failingSince.IsZero() {
		s.log.Info("lease renewed again", zap.Duration("after", time.Since(s.failingSince).Round(time.Second)))
		s.failingSince, s.failSaid = time.Time{}, time.Time{}
	}
	s.renewals.Add(1)
	return resp.Events, nil
}

// repair marks the replicas events say are lost and copies every lost or
// draining replica to a new one.
func (s *Store) repair(ctx context.Context, events []pool.Event) error {
	type work struct {
		slab remote.SlabID
		from string
	}
	var todo []work
	seen := map[work]bool{}
	for _, ev := range events {
		w := work{s.tableSlab(remote.SlabID(ev.Slab), string(ev.Server)), string(ev.Server)}
		if ev.Type == pool.EventReplicaLost {
			if s.table.SetState(w.slab, w.from, slabio.Lost) == nil {
				s.log.Warn("replica lost", zap.Uint64("slab", uint64(w.slab)), zap.String("server", w.from))
			}
		}
		if !seen[w] {
			seen[w] = true
			todo = append(todo, w)
		}
	}
	// Replicas the data plane found stale (a missed WRITE).
	for _, gid := range s.table.IDs() {
		ids, _ := s.table.Group(gid)
		if ids == nil {
			ids = []remote.SlabID{gid}
		}
		for _, id := range ids {
			reps, _ := s.table.Replicas(id)
			for _, r := range reps {
				w := work{id, r.Server}
				if r.State == slabio.Lost && !seen[w] {
					seen[w] = true
					todo = append(todo, w)
				}
			}
		}
	}
	var errs []error
	for _, w := range todo {
		if err := s.migrate(ctx, w.slab, w.from); err != nil {
			s.migrateErr.Add(1)
			s.log.Warn("restoring a replica failed; retrying at the next renewal",
				zap.Uint64("slab", uint64(w.slab)), zap.String("from", w.from), zap.Error(err))
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tableSlab returns the Table's slab of pool slab id's replica on server:
// id, or the shard of group id that the replica holds.
func (s *Store) tableSlab(id remote.SlabID, server string) remote.SlabID {
	s.partsMu.Lock()
	sh, part := s.partOf[pool.SlabID(id)]
	s.partsMu.Unlock()
	if part {
		return sh
	}
	shards, _ := s.table.Group(id)
	for _, sh := range shards {
		reps, _ := s.table.Replicas(sh)
		for _, r := range reps {
			if r.Server == server {
				return sh
			}
		}
	}
	return id
}

// migrate replaces slab id's replica on from by a new one. A shard of an
// erasure-coded slab is copied from its replica on from while that is
// healthy (a drain), else rebuilt from the rest of its stripes.
func (s *Store) migrate(ctx context.Context, id remote.SlabID, from string) error {
	reps, ok := s.table.Replicas(id)
	if !ok {
		return nil // freed meanwhile
	}
	// A shard of an erasure-coded slab is rebuilt from its stripes; a
	// part of a unit of copies is copied as any slab.
	gid, _, shard := slabio.ShardOf(id)
	if _, _, m := s.table.Layout(gid); m == 0 {
		shard = false
	}
	pid := s.poolSlab(id)
	alive := 0
	for _, r := range reps {
		if r.State == slabio.Healthy && r.Server != from {
			alive++
		}
	}
	fromHealthy := false
	for _, r := range reps {
		if r.Server == from && r.State == slabio.Healthy {
			fromHealthy = true
		}
	}
	if alive == 0 && !fromHealthy && !shard {
		s.lostMu.Lock()
		first := !s.lostSaid[id]
		if s.lostSaid == nil {
			s.lostSaid = map[remote.SlabID]bool{}
		}
		s.lostSaid[id] = true
		s.lostMu.Unlock()
		if first {
			s.log.Error("slab lost: no replica survives; its evicted pages will raise SIGBUS",
				zap.Uint64("slab", uint64(id)))
		}
		return fmt.Errorf("poolstore: slab %d: %w", id, remote.ErrLost)
	}
	view, err := s.opts.Pool.Replace(ctx, s.lease.ID, pool.SlabID(pid), pool.ServerID(from))
	if err != nil {
		return fmt.Errorf("poolstore: replace slab %d on %s: %w", pid, from, err)
	}
	to, err := s.replica(view)
	if err != nil {
		return err
	}
	if err := s.table.Migrate(ctx, id, from, to); err != nil {
		return err
	}
	if err := s.opts.Pool.Migrated(ctx, s.lease.ID, pool.SlabID(pid), pool.ServerID(from)); err != nil {
		return fmt.Errorf("poolstore: report slab %d migrated from %s: %w", pid, from, err)
	}
	s.migrations.Add(1)
	s.log.Info("replica restored", zap.Uint64("slab", uint64(pid)), zap.String("from", from), zap.String("to", to.Server), zap.Bool("shard", shard))
	return nil
}

// Close stops renewing and ends the lease, which frees every slab. Safe to
// call twice.
func (s *Store) Close(ctx context.Context) error {
	return s.close(ctx, true)
}

// Abandon stops renewing the lease without ending it, as a killed agent
// leaves it: an agent started within its TTL takes it over (Options.Adopt)
// with the pages of the programs it resumes.
func (s *Store) Abandon() { s.close(context.Background(), false) }

func (s *Store) close(ctx context.Context, end bool) error {
	var err error
	s.once.Do(func() {
		s.cancel()
		<-s.done
		for _, id := range s.table.IDs() {
			s.Forget(id)
		}
		if !end {
			return
		}
		if e := s.opts.Pool.DeleteLease(ctx, s.lease.ID); e != nil && !errors.Is(e, pool.ErrNotFound) {
			err = fmt.Errorf("poolstore: end lease: %w", e)
		}
	})
	return err
}
