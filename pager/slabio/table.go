package slabio

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"rmem/pager/remote"
	"rmem/rdma"
)

// State is a replica's health as the Table sees it.
type State uint8

const (
	// Healthy replicas are read and written.
	Healthy State = iota
	// Filling replicas are being copied to (Migrate): written, not read.
	Filling
	// Lost replicas hold no usable data: neither read nor written.
	Lost
)

func (s State) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Filling:
		return "filling"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Replica is one copy of a slab, reachable with rdma.
type Replica struct {
	Server  string // memory server id (distinct per replica of a slab)
	Network string // rdma provider ("tcp", "shm", "mem")
	Addr    string
	Key     rdma.Key // read/write key of the slab's range
	State   State
}

// ErrNoReplica: a replica named by server is not part of the slab.
var ErrNoReplica = errors.New("slabio: no such replica")

// Stats counts what the Table's IOs did.
type Stats struct {
	Reads     uint64 // pages (ops) read successfully
	Writes    uint64 // ops written to at least one replica
	Failovers uint64 // READs moved to another replica after an error
	Lost      uint64 // ops that ended with remote.ErrLost
	Stale     uint64 // replicas marked Lost after a partly failed WRITE
	Copied    uint64 // bytes copied by Migrate
	Stalls    uint64 // servers that missed an op deadline (skipped for a while)
	// IO.RegisterLocal buffers registered with a connection (verbs: moved
	// without a bounce copy) and registrations the connection refused.
	LocalRegistered uint64
	LocalRefused    uint64
	// Checksums (package doc, Checksums): page copies read that failed
	// theirs, and pages written back to their replicas after a good copy
	// was found.
	Corrupt  uint64
	Repaired uint64
	// Degraded: pages of erasure-coded slabs read from the rest of their
	// stripe (their shard lost, unreachable or bad).
	Degraded uint64
}

// Table is the set of slabs an agent holds, with their replicas.
type Table struct {
	slabSize uint64
	dial     rdma.DialOptions

	copyMu sync.RWMutex // IO.Write: R for a call; Migrate: W per chunk

	mu     sync.RWMutex
	slabs  map[remote.SlabID]slabEntry
	groups map[remote.SlabID]*group // erasure-coded slabs (ec.go); their shards are in slabs

	hasGroups atomic.Bool // a group was ever put: IOs take the ec paths
	// stripeMu: a stripe's WRITE and degraded READs exclude each other
	// (ec.go). Lock order: stripeMu (in lock order), then copyMu.
	stripeMu [stripeLocks]sync.Mutex

	reads, writes, failovers, lost, stale, copied, stalls atomic.Uint64
	localRegistered, localRefused                         atomic.Uint64
	corrupt, repaired, degraded                           atomic.Uint64

	// badMu guards bad: the (slab, server) pairs already reported to
	// onCorrupt, so that each is reported once.
	badMu     sync.Mutex
	bad       map[badCopy]bool
	onCorrupt func(id remote.SlabID, server string, off uint64)

	sumDir string // PersistSums
}

// slabEntry is a slab's replicas (a copy-on-write slice: replaced, never
// changed in place) and its pages' checksums (sums.go), shared by every
// IO and changed one element at a time.
type slabEntry struct {
	reps []Replica
	sums []atomic.Uint64
	file *sumFile // PersistSums; nil: none
}

type badCopy struct {
	id     remote.SlabID
	server string
}

// NewTable returns an empty table of slabs of slabSize bytes. dial are the
// options IOs dial replicas with (Depth bounds a batch).
func NewTable(slabSize uint64, dial rdma.DialOptions) *Table {
	return &Table{slabSize: slabSize, dial: dial, slabs: map[remote.SlabID]slabEntry{}, groups: map[remote.SlabID]*group{}, bad: map[badCopy]bool{}}
}

// OnCorrupt sets f to be called, once per slab and server, when a copy of
// a page read there fails its checksum (off: the page's byte offset in the
// slab). f must not block; it is called from the IO that found it.
func (t *Table) OnCorrupt(f func(id remote.SlabID, server string, off uint64)) {
	t.badMu.Lock()
	t.onCorrupt = f
	t.badMu.Unlock()
}

// reportCorrupt counts n bad copies read from server and calls onCorrupt
// the first time the pair is seen.
func (t *Table) reportCorrupt(id remote.SlabID, server string, off uint64, n int) {
	t.corrupt.Add(uint64(n))
	t.badMu.Lock()
	f, seen := t.onCorrupt, t.bad[badCopy{id, server}]
	t.bad[badCopy{id, server}] = true
	t.badMu.Unlock()
	if f != nil && !seen {
		f(id, server, off)
	}
}

// SlabSize returns the slab size.
func (t *Table) SlabSize() uint64 { return t.slabSize }

// PersistSums keeps the checksums of the slabs put from now on in files in
// dir (sums.go), for the agent after this one (Adopt). Call it before the
// first Put.
func (t *Table) PersistSums(dir string) {
	t.mu.Lock()
	t.sumDir = dir
	t.mu.Unlock()
}

// Put adds or replaces slab id with a copy of reps. A slab put again
// keeps its pages' checksums; a new one has none yet (nothing verified
// until written).
func (t *Table) Put(id remote.SlabID, reps []Replica) error { return t.put(id, reps, false) }

// Adopt is Put for a slab an agent before this one wrote: its pages'
// checksums are loaded from the file that agent kept (PersistSums), if
// there is one.
func (t *Table) Adopt(id remote.SlabID, reps []Replica) error { return t.put(id, reps, true) }

// put returns the error of a sum file it could not make: the slab is put
// all the same, its sums kept in memory only. A new slab's sums and file
// are made before t.mu is taken: every IO takes it for each op.
func (t *Table) put(id remote.SlabID, reps []Replica, keep bool) error {
	c := append([]Replica(nil), reps...)
	t.mu.RLock()
	_, known := t.slabs[id]
	dir := t.sumDir
	t.mu.RUnlock()
	var fresh slabEntry
	var err error
	if !known {
		fresh.sums = make([]atomic.Uint64, t.slabSize/pageSize)
		if dir != "" {
			fresh.file, err = openSumFile(dir, id, fresh.sums, keep)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.slabs[id]
	switch {
	case !ok && fresh.sums == nil: // removed meanwhile: put anew, without a file
		e.sums = make([]atomic.Uint64, t.slabSize/pageSize)
	case !ok:
		e = fresh
	case fresh.file != nil: // put meanwhile by another caller: its file stays
		fresh.file.f.Close()
	}
	e.reps = c
	t.slabs[id] = e
	return err
}

// Remove forgets slab id (and its sum file), or group id and its shards.
func (t *Table) Remove(id remote.SlabID) {
	t.mu.Lock()
	if g := t.groups[id]; g != nil {
		delete(t.groups, id)
		t.mu.Unlock()
		for _, s := range g.shards {
			t.Remove(s)
		}
		return
	}
	if e, ok := t.slabs[id]; ok && e.file != nil {
		e.file.drop()
	}
	delete(t.slabs, id)
	t.mu.Unlock()
	t.badMu.Lock()
	for k := range t.bad {
		if k.id == id {
			delete(t.bad, k)
		}
	}
	t.badMu.Unlock()
}

// Replicas returns a copy of slab id's replicas (nil, false if unknown).
func (t *Table) Replicas(id remote.SlabID) ([]Replica, bool) {
	reps, ok := t.lookup(id)
	return append([]Replica(nil), reps...), ok
}

// Copies returns how many replicas of slab id hold its data (not Lost;
// a Filling one, being copied to, counts), 0 for an unknown slab.
func (t *Table) Copies(id remote.SlabID) int {
	reps, _ := t.lookup(id)
	n := 0
	for _, r := range reps {
		if r.State != Lost {
			n++
		}
	}
	return n
}

// IDs returns the slabs in the table: groups, not their shards.
func (t *Table) IDs() []remote.SlabID {
	t.mu.RLock()
	defer t.mu.RUnlock()
	ids := make([]remote.SlabID, 0, len(t.slabs))
	for id := range t.slabs {
		if !isShard(id) {
			ids = append(ids, id)
		}
	}
	for id := range t.groups {
		ids = append(ids, id)
	}
	return ids
}

// lookup returns the slab's replica slice, which must not be modified.
func (t *Table) lookup(id remote.SlabID) ([]Replica, bool) {
	e, ok := t.entry(id)
	return e.reps, ok
}

// entry returns the slab's entry: its replica slice, which must not be
// modified, and its checksums.
func (t *Table) entry(id remote.SlabID) (slabEntry, bool) {
	t.mu.RLock()
	e, ok := t.slabs[id]
	t.mu.RUnlock()
	return e, ok
}

// SetState sets the state of the slab's replica on server.
func (t *Table) SetState(id remote.SlabID, server string, st State) error {
	return t.update(id, func(reps []Replica) ([]Replica, error) {
		for i := range reps {
			if reps[i].Server == server {
				reps[i].State = st
				return reps, nil
			}
		}
		return nil, fmt.Errorf("%w: slab %d on %q", ErrNoReplica, id, server)
	})
}

// MarkServerLost marks every replica on server Lost and returns the slabs
// that had one.
func (t *Table) MarkServerLost(server string) []remote.SlabID {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []remote.SlabID
	for id, e := range t.slabs {
		reps := e.reps
		for i := range reps {
			if reps[i].Server == server && reps[i].State != Lost {
				c := append([]Replica(nil), reps...)
				c[i].State = Lost
				e.reps = c
				t.slabs[id] = e
				ids = append(ids, id)
				break
			}
		}
	}
	return ids
}

// update replaces slab id's replicas by f's result on a private copy.
func (t *Table) update(id remote.SlabID, f func([]Replica) ([]Replica, error)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.slabs[id]
	if !ok {
		return fmt.Errorf("%w: %d", remote.ErrUnknownSlab, id)
	}
	c, err := f(append([]Replica(nil), e.reps...))
	if err != nil {
		return err
	}
	e.reps = c
	t.slabs[id] = e
	return nil
}

// markLostIf marks the replica Lost unless it changed meanwhile.
func (t *Table) markLost(id remote.SlabID, server string) {
	if t.SetState(id, server, Lost) == nil {
		t.stale.Add(1)
	}
}

// Stats returns the counters.
func (t *Table) Stats() Stats {
	return Stats{
		Reads: t.reads.Load(), Writes: t.writes.Load(), Failovers: t.failovers.Load(),
		Lost: t.lost.Load(), Stale: t.stale.Load(), Copied: t.copied.Load(), Stalls: t.stalls.Load(),
		LocalRegistered: t.localRegistered.Load(), LocalRefused: t.localRefused.Load(),
		Corrupt: t.corrupt.Load(), Repaired: t.repaired.Load(), Degraded: t.degraded.Load(),
	}
}

// MigrateChunk is the bytes Migrate copies per step.
const MigrateChunk = 256 << 10

// Migrate copies slab id onto to, a new replica, and then drops the replica
// on from (draining or lost). The slab stays usable throughout: to is
// written by IO.Write while Filling and becomes Healthy at the end. On
// error to is removed again and from is left as it was.
func (t *Table) Migrate(ctx context.Context, id remote.SlabID, from string, to Replica) error {
	to.State = Filling
	err := t.update(id, func(reps []Replica) ([]Replica, error) {
		for _, r := range reps {
			if r.Server == to.Server {
				return nil, fmt.Errorf("slabio: slab %d already has a replica on %q", id, to.Server)
			}
		}
		return append(reps, to), nil
	})
	if err != nil {
		return err
	}
	err = t.copySlab(ctx, id, to)
	// The switch excludes IO.Write calls like a chunk of the copy: a
	// WRITE posted to the replicas of before must complete before the
	// caller revokes the one dropped. Otherwise the WRITE failed there
	// (revoked key), and the new replica, Filling when it was posted,
	// did not count: a WRITE the slab holds was reported unavailable.
	t.copyMu.Lock()
	defer t.copyMu.Unlock()
	if err != nil {
		t.update(id, func(reps []Replica) ([]Replica, error) { return dropServer(reps, to.Server), nil })
		return err
	}
	return t.update(id, func(reps []Replica) ([]Replica, error) {
		for i := range reps {
			if reps[i].Server == to.Server {
				if reps[i].State != Filling {
					return nil, fmt.Errorf("slabio: slab %d: new replica on %q failed during the copy", id, to.Server)
				}
				reps[i].State = Healthy
			}
		}
		return dropServer(reps, from), nil
	})
}

func dropServer(reps []Replica, server string) []Replica {
	out := reps[:0]
	for _, r := range reps {
		if r.Server != server {
			out = append(out, r)
		}
	}
	return out
}

// copySlab copies the slab from its healthy replicas to the replica to.
func (t *Table) copySlab(ctx context.Context, id remote.SlabID, to Replica) error {
	io := t.NewIO()
	io.noFix = true // the good copies it finds go to the new replica
	defer io.Close()
	dst, err := rdma.Dial(ctx, to.Network, to.Addr, t.dial)
	if err != nil {
		return fmt.Errorf("slabio: migrate slab %d: dial %s: %w", id, to.Server, err)
	}
	defer dst.Close()
	buf := make([]byte, min(MigrateChunk, t.slabSize))
	ops := make([]remote.PageOp, 1)
	for off := uint64(0); off < t.slabSize; off += uint64(len(buf)) {
		n := min(uint64(len(buf)), t.slabSize-off)
		t.copyMu.Lock()
		ops[0] = remote.PageOp{Slab: id, Off: off, Buf: buf[:n]}
		err := io.readReplicas(ctx, ops)
		if err == nil {
			err = ops[0].Err
		}
		if err != nil && isShard(id) && !errors.Is(err, remote.ErrCorrupt) {
			// A shard with no replica to copy from: rebuilt from the
			// rest of each stripe.
			err = io.rebuildChunk(ctx, id, off, buf[:n])
		}
		if errors.Is(err, remote.ErrCorrupt) {
			// Pages with no good copy are copied as they are: they
			// still fail their checksums on the new replica, and the
			// chunk's other pages are the good copies Read found.
			err = nil
		}
		if err == nil {
			err = rdma.Write(ctx, dst, to.Key, off, buf[:n])
		}
		t.copyMu.Unlock()
		if err != nil {
			return fmt.Errorf("slabio: migrate slab %d to %s at %d: %w", id, to.Server, off, err)
		}
		t.copied.Add(n)
	}
	return nil
}
