package pagertest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"rmem/pager/remote"
	"rmem/pager/slabio"
	"rmem/rdma"
	"rmem/rdma/rdmatest"
	_ "rmem/rdma/tcp" // the "tcp" provider
)

var _ remote.Store = (*Store)(nil)

// Options configure a Store.
type Options struct {
	Servers        int    // memory servers (default 2)
	Replicas       int    // replicas per slab, ≤ Servers (default 1)
	SlabSize       uint64 // bytes (default 1 MiB)
	SlabsPerServer int    // capacity of each server (default 64)
	Network        string // "mem" (default) or "tcp" (loopback)
	// ECData, ECParity > 0: slabs are erasure-coded (ec:ECData+ECParity,
	// slabio.PutGroup) instead of replicated: a slab is SlabSize x
	// ECData bytes over ECData+ECParity shards on distinct servers.
	ECData, ECParity int
}

func (o *Options) defaults() {
	if o.Servers == 0 {
		o.Servers = 2
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.SlabSize == 0 {
		o.SlabSize = 1 << 20
	}
	if o.SlabsPerServer == 0 {
		o.SlabsPerServer = 64
	}
	if o.Network == "" {
		o.Network = rdmatest.Network
	}
}

type server struct {
	name   string
	domain *rdma.Domain
	region *rdma.Region
	ln     rdma.Listener
	free   []int // free slab indexes
	dead   bool
}

type placement struct {
	server int
	index  int
	key    rdma.Key
}

// Store is an in-memory remote.Store.
type Store struct {
	opts  Options
	table *slabio.Table

	mu      sync.Mutex
	servers []*server
	slabs   map[remote.SlabID][]placement
	next    remote.SlabID
	rr      int
	allocs  int
	limit   int // slabs held at most (0: the servers' capacity)
}

// ErrNoCapacity: not enough live servers or free slabs (a remote.ErrFull).
var ErrNoCapacity = fmt.Errorf("pagertest: no capacity: %w", remote.ErrFull)

// New starts the servers; tb.Cleanup stops them.
func New(tb testing.TB, opts Options) *Store {
	tb.Helper()
	opts.defaults()
	if opts.ECParity > 0 && opts.ECData+opts.ECParity > opts.Servers {
		tb.Fatalf("pagertest: ec:%d+%d needs as many servers, have %d", opts.ECData, opts.ECParity, opts.Servers)
	}
	if opts.Replicas > opts.Servers {
		tb.Fatalf("pagertest: %d replicas need as many servers, have %d", opts.Replicas, opts.Servers)
	}
	s := &Store{
		opts:  opts,
		table: slabio.NewTable(opts.SlabSize, rdma.DialOptions{Depth: 256}),
		slabs: map[remote.SlabID][]placement{},
	}
	for i := 0; i < opts.Servers; i++ {
		d := rdma.NewDomain(rdma.DomainOptions{})
		r := rdma.NewRegion(make([]byte, opts.SlabSize*uint64(opts.SlabsPerServer)))
		if err := d.Register(r); err != nil {
			tb.Fatal(err)
		}
		addr := ""
		if opts.Network == "tcp" {
			addr = "127.0.0.1:0"
		}
		ln, err := rdma.Listen(opts.Network, addr, d, rdma.ListenOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		sv := &server{name: fmt.Sprintf("server-%d", i), domain: d, region: r, ln: ln}
		for j := opts.SlabsPerServer - 1; j >= 0; j-- {
			sv.free = append(sv.free, j)
		}
		s.servers = append(s.servers, sv)
		tb.Cleanup(func() { ln.Close() })
	}
	return s
}

// Table returns the Store's slab table (for stats and inspection).
func (s *Store) Table() *slabio.Table { return s.table }

// Layout returns how slab id is kept (slabio.Table.Layout).
func (s *Store) Layout(id remote.SlabID) (copies, k, m int) { return s.table.Layout(id) }

// SlabSize implements remote.Store.
func (s *Store) SlabSize() uint64 {
	if s.opts.ECParity > 0 {
		return s.opts.SlabSize * uint64(s.opts.ECData)
	}
	return s.opts.SlabSize
}

// OpenIO implements remote.Store.
func (s *Store) OpenIO() (remote.PageIO, error) { return s.table.NewIO(), nil }

// Alloc implements remote.Store.
func (s *Store) Alloc(ctx context.Context, n int) ([]remote.SlabID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit > 0 && len(s.slabs)+n > s.limit {
		return nil, fmt.Errorf("%w: %d slabs held, limit %d", ErrNoCapacity, len(s.slabs), s.limit)
	}
	ids := make([]remote.SlabID, 0, n)
	for k := 0; k < n; k++ {
		n := s.opts.Replicas
		if s.opts.ECParity > 0 {
			n = s.opts.ECData + s.opts.ECParity
		}
		pl, err := s.placeLocked(n, nil)
		if err != nil {
			for _, id := range ids {
				s.freeLocked(ctx, id)
			}
			return nil, err
		}
		s.next++
		id := s.next
		s.slabs[id] = pl
		reps := s.replicasLocked(pl)
		if s.opts.ECParity > 0 {
			shards := make([][]slabio.Replica, len(reps))
			for i := range reps {
				shards[i] = reps[i : i+1]
			}
			s.table.PutGroup(id, s.opts.ECData, s.opts.ECParity, shards)
		} else {
			s.table.Put(id, reps)
		}
		ids = append(ids, id)
	}
	s.allocs += n
	return ids, nil
}

// SetLimit bounds the slabs the Store holds at once (0: only the
// servers' capacity), as a pool that other agents filled.
func (s *Store) SetLimit(slabs int) {
	s.mu.Lock()
	s.limit = slabs
	s.mu.Unlock()
}

// Slabs returns the slabs the Store holds.
func (s *Store) Slabs() []remote.SlabID { return s.table.IDs() }

// Allocated returns the slabs allocated so far and currently held.
func (s *Store) Allocated() (total, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allocs, len(s.slabs)
}

// placeLocked takes n free slabs on distinct live servers not in avoid.
func (s *Store) placeLocked(n int, avoid map[int]bool) ([]placement, error) {
	var pl []placement
	used := map[int]bool{}
	for tries := 0; len(pl) < n && tries < len(s.servers); tries++ {
		i := s.rr % len(s.servers)
		s.rr++
		sv := s.servers[i]
		if sv.dead || used[i] || avoid[i] || len(sv.free) == 0 {
			continue
		}
		idx := sv.free[len(sv.free)-1]
		key, err := sv.domain.IssueKey(sv.region, uint64(idx)*s.opts.SlabSize, s.opts.SlabSize, rdma.AccessReadWrite)
		if err != nil {
			break
		}
		sv.free = sv.free[:len(sv.free)-1]
		used[i] = true
		pl = append(pl, placement{server: i, index: idx, key: key})
	}
	if len(pl) < n {
		for _, p := range pl {
			s.releaseLocked(context.Background(), p)
		}
		return nil, fmt.Errorf("%w: %d replicas wanted", ErrNoCapacity, n)
	}
	return pl, nil
}

func (s *Store) replicasLocked(pl []placement) []slabio.Replica {
	reps := make([]slabio.Replica, len(pl))
	for i, p := range pl {
		sv := s.servers[p.server]
		reps[i] = slabio.Replica{Server: sv.name, Network: s.opts.Network, Addr: sv.ln.Addr(), Key: p.key}
	}
	return reps
}

func (s *Store) releaseLocked(ctx context.Context, p placement) {
	sv := s.servers[p.server]
	sv.domain.Revoke(ctx, p.key)
	if sv.dead {
		return
	}
	off := uint64(p.index) * s.opts.SlabSize
	clear(sv.region.Bytes()[off : off+s.opts.SlabSize])
	sv.free = append(sv.free, p.index)
}

func (s *Store) freeLocked(ctx context.Context, id remote.SlabID) {
	for _, p := range s.slabs[id] {
		s.releaseLocked(ctx, p)
	}
	delete(s.slabs, id)
	s.table.Remove(id)
}

// Free implements remote.Store.
func (s *Store) Free(ctx context.Context, ids []remote.SlabID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.freeLocked(ctx, id)
	}
	return nil
}

// Servers returns the number of servers.
func (s *Store) Servers() int { return len(s.servers) }

// Kill makes server i unreachable (every connection fails, dials fail);
// its memory and keys survive, as with a network partition.
func (s *Store) Kill(i int) { s.servers[i].ln.Close() }

// Lose kills server i and drops its memory, as a crashed memory server
// whose pool reports its replicas lost.
func (s *Store) Lose(i int) {
	s.mu.Lock()
	sv := s.servers[i]
	sv.dead = true
	s.mu.Unlock()
	sv.ln.Close()
	s.table.MarkServerLost(sv.name)
}

// Repair restores redundancy as an agent does on replica-lost and
// replica-drain events: every replica that is lost, or on a server in
// from, is copied to a new slab on another live server and then dropped.
// It returns the number of replicas moved.
func (s *Store) Repair(ctx context.Context, from ...int) (int, error) {
	moved := 0
	for _, id := range s.table.IDs() {
		if shards, _ := s.table.Group(id); shards != nil {
			n, err := s.repairGroup(ctx, id, shards, from)
			moved += n
			if err != nil {
				return moved, err
			}
			continue
		}
		reps, ok := s.table.Replicas(id)
		if !ok {
			continue
		}
		for ri, r := range reps {
			if !s.leaving(r, from) {
				continue
			}
			err := s.move(ctx, id, id, r.Server, from, func(pl placement) {
				old := s.slabs[id]
				keep := make([]placement, 0, len(old))
				for _, p := range old {
					if s.servers[p.server].name == reps[ri].Server {
						s.releaseLocked(ctx, p)
						continue
					}
					keep = append(keep, p)
				}
				s.slabs[id] = append(keep, pl)
			})
			if err != nil {
				return moved, err
			}
			moved++
		}
	}
	return moved, nil
}

// repairGroup is Repair for group id: each shard that is lost or on a
// server of from is rebuilt on another live server (placement i is shard
// i's).
func (s *Store) repairGroup(ctx context.Context, id remote.SlabID, shards []remote.SlabID, from []int) (int, error) {
	moved := 0
	for i, sid := range shards {
		reps, _ := s.table.Replicas(sid)
		if len(reps) != 1 || !s.leaving(reps[0], from) {
			continue
		}
		err := s.move(ctx, id, sid, reps[0].Server, from, func(pl placement) {
			s.releaseLocked(ctx, s.slabs[id][i])
			s.slabs[id][i] = pl
		})
		if err != nil {
			return moved, err
		}
		moved++
	}
	return moved, nil
}

// leaving reports whether replica r is to be moved: lost, or on a server
// of from.
func (s *Store) leaving(r slabio.Replica, from []int) bool {
	leaving := r.State == slabio.Lost
	for _, f := range from {
		leaving = leaving || s.servers[f].name == r.Server
	}
	return leaving
}

// move places a new slab on a live server that holds none of slab id's
// placements nor is in from, copies table slab tid's replica on server to
// it (Table.Migrate), and then, under the lock, hands it to swap to take
// the old one's place; on error the new slab is released.
func (s *Store) move(ctx context.Context, id, tid remote.SlabID, server string, from []int, swap func(placement)) error {
	s.mu.Lock()
	avoid := map[int]bool{}
	for _, p := range s.slabs[id] {
		avoid[p.server] = true
	}
	for _, f := range from {
		avoid[f] = true
	}
	pl, err := s.placeLocked(1, avoid)
	var to slabio.Replica
	if err == nil {
		to = s.replicasLocked(pl)[0]
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.table.Migrate(ctx, tid, server, to); err != nil {
		s.mu.Lock()
		s.releaseLocked(ctx, pl[0])
		s.mu.Unlock()
		return err
	}
	s.mu.Lock()
	swap(pl[0])
	s.mu.Unlock()
	return nil
}

// Scribble overwrites b at byte offset off of replica ri (in placement
// order; of an erasure-coded slab, shard ri) of slab id, behind the Table's back: a stray write, or a memory
// server's DIMM going bad. It goes through the server's rdma listener, as
// any peer's WRITE would.
func (s *Store) Scribble(ctx context.Context, id remote.SlabID, ri int, off uint64, b []byte) error {
	s.mu.Lock()
	pl, ok := s.slabs[id]
	s.mu.Unlock()
	if !ok || ri >= len(pl) {
		return fmt.Errorf("pagertest: slab %d has no replica %d", id, ri)
	}
	sv := s.servers[pl[ri].server]
	c, err := rdma.Dial(ctx, s.opts.Network, sv.ln.Addr(), rdma.DialOptions{})
	if err != nil {
		return err
	}
	defer c.Close()
	return rdma.Write(ctx, c, pl[ri].key, off, b)
}
