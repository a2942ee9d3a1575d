package poolstore_test

import (
	"context"
	"testing"
	"time"

	"rmem/pager/poolstore"
	"rmem/pager/remote"
	"rmem/pager/slabio"
	"rmem/pool"
)

// ec:3+2 over a real pool of eight servers: a slab is three pool slabs of
// data; a drained server's shard is copied, a left server's rebuilt from
// the stripes (the pool keeps each replica's shard); an agent that adopts
// the lease reads the pages, checked against the sums the first kept.
func TestErasureCodedSlabs(t *testing.T) {
	ctx := context.Background()
	cl, servers := startPool(t, 8)
	red := pool.Redundancy{K: 3, M: 2}
	sums := t.TempDir()
	s, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 1, TTL: time.Minute, Redundancy: red, SumDir: sums})
	if err != nil {
		t.Fatal(err)
	}
	if s.SlabSize() != 3*slabSize {
		t.Fatalf("slab size %d, want 3 pool slabs", s.SlabSize())
	}
	ids, err := s.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	id := ids[0]
	shards, k := s.Table().Group(id)
	if k != 3 || len(shards) != 5 {
		t.Fatalf("group %d: %d shards, k %d", id, len(shards), k)
	}
	if c, k, m := s.Layout(id); c != 1 || k != 3 || m != 2 {
		t.Fatalf("layout %d %d %d", c, k, m)
	}
	io, _ := s.OpenIO()
	const pages = 48
	ops := make([]remote.PageOp, pages)
	for p := range ops {
		b := make([]byte, 4096)
		pattern(b, byte(p*3+1))
		ops[p] = remote.PageOp{Slab: id, Off: uint64(p) * 4096 * 5, Buf: b}
	}
	if err := io.Write(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
	}
	readBack(t, io, ops, "written")
	server := func(sh int) pool.ServerID {
		reps, _ := s.Table().Replicas(shards[sh])
		return pool.ServerID(reps[0].Server)
	}
	// Drain the server of data shard 0: copied from it.
	victim := server(0)
	if _, err := cl.Drain(ctx, victim, true); err != nil {
		t.Fatal(err)
	}
	if err := s.RenewOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if dv, err := cl.DrainStatus(ctx, victim); err != nil || !dv.Done {
		t.Fatalf("drain of %s not done after a renewal: %+v %v", victim, dv, err)
	}
	servers[victim].Close()
	readBack(t, io, ops, "after the drain")
	// The servers of shards 1 and 3 leave without draining: rebuilt from
	// the rest of the stripes onto the two servers left.
	a, b := server(1), server(3)
	for _, g := range []pool.ServerID{a, b} {
		if err := cl.Leave(ctx, g); err != nil {
			t.Fatal(err)
		}
		servers[g].Close()
	}
	readBack(t, io, ops, "two servers gone")
	if err := s.RenewOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Migrations != 3 {
		t.Fatalf("migrations %d, want the drain and two rebuilds", st.Migrations)
	}
	for i := range shards {
		if reps, _ := s.Table().Replicas(shards[i]); len(reps) != 1 || reps[0].State != slabio.Healthy {
			t.Fatalf("shard %d after the rebuild: %+v", i, reps)
		}
	}
	if st := s.Table().Stats(); st.Degraded == 0 {
		t.Fatal("no degraded reads with two shards gone")
	}
	io.Close()
	// A new agent adopts the lease: same layout, shards in place, the
	// pages checked against the first agent's sums.
	s.Abandon()
	s2, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 2, TTL: time.Minute, Redundancy: red, SumDir: sums,
		Adopt: s.Lease().ID, AdoptSecret: s.Lease().Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	if !s2.Adopted() {
		t.Fatal("not adopted")
	}
	if got, _ := s2.Table().Group(id); len(got) != 5 {
		t.Fatalf("adopted group: %v", got)
	}
	io2, _ := s2.OpenIO()
	defer io2.Close()
	readBack(t, io2, ops, "adopted")
	// The rebuilt shards are what the stripes need: two more servers go.
	for _, sh := range []int{0, 4} {
		reps, _ := s2.Table().Replicas(shards[sh])
		servers[pool.ServerID(reps[0].Server)].Close()
	}
	readBack(t, io2, ops, "adopted, two more servers gone")
	// An agent with another redundancy refuses the lease's slabs.
	s2.Abandon()
	if _, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 3, TTL: time.Minute, Replicas: 2,
		Adopt: s.Lease().ID, AdoptSecret: s.Lease().Secret}); err == nil {
		t.Fatal("a rep:2 agent adopted ec:3+2 slabs")
	}
}

// With fewer servers than ec:3+2's five to place on, new slabs fall back
// to units of three pool slabs of three copies each (the same tolerance
// of two lost servers), which survive a loss and are repaired as copies;
// once five servers take slabs again, new slabs are erasure-coded.
func TestErasureCodedFallback(t *testing.T) {
	ctx := context.Background()
	cl, servers := startPool(t, 5)
	var ids []pool.ServerID
	for id := range servers {
		ids = append(ids, id)
	}
	// A draining server takes no new slabs: four to place on.
	if _, err := cl.Drain(ctx, ids[0], true); err != nil {
		t.Fatal(err)
	}
	red := pool.Redundancy{K: 3, M: 2}
	s, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 1, TTL: time.Minute, Redundancy: red})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	got, err := s.Alloc(ctx, 1)
	if err != nil {
		t.Fatalf("no fallback: %v", err)
	}
	id := got[0]
	if c, k, m := s.Layout(id); c != 3 || k != 3 || m != 0 {
		t.Fatalf("fallback layout: copies %d k %d m %d, want 3 copies of 3 parts", c, k, m)
	}
	io, _ := s.OpenIO()
	defer io.Close()
	ops := make([]remote.PageOp, 30)
	for p := range ops {
		b := make([]byte, 4096)
		pattern(b, byte(p+9))
		ops[p] = remote.PageOp{Slab: id, Off: uint64(p) * 4096 * 7, Buf: b}
	}
	if err := io.Write(ctx, ops); err != nil {
		t.Fatal(err)
	}
	readBack(t, io, ops, "written")
	// Five servers take slabs again: the next slab is erasure-coded.
	if _, err := cl.Drain(ctx, ids[0], false); err != nil {
		t.Fatal(err)
	}
	next, err := s.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if c, k, m := s.Layout(next[0]); c != 1 || k != 3 || m != 2 {
		t.Fatalf("with five servers: copies %d k %d m %d, want ec:3+2", c, k, m)
	}
	if err := s.Free(ctx, next); err != nil {
		t.Fatal(err)
	}
	// Two servers holding copies leave: the pages read from the third
	// copy, and the renewal repairs the parts' replicas.
	shards, _ := s.Table().Group(id)
	reps, _ := s.Table().Replicas(shards[0])
	for _, r := range reps[:2] {
		if err := cl.Leave(ctx, pool.ServerID(r.Server)); err != nil {
			t.Fatal(err)
		}
		servers[pool.ServerID(r.Server)].Close()
	}
	readBack(t, io, ops, "two servers gone")
	s.RenewOnce(ctx) // two servers for the lost copies: some wait for more
	if st := s.Stats(); st.Migrations == 0 {
		t.Fatal("no part's replica was restored")
	}
	readBack(t, io, ops, "after the repair")
	// Freed: every part goes back to the pool.
	if err := s.Free(ctx, []remote.SlabID{id}); err != nil {
		t.Fatal(err)
	}
	views, err := cl.LeaseSlabs(ctx, s.Lease().ID)
	if err != nil || len(views) != 0 {
		t.Fatalf("after the free the lease holds %d slabs (%v)", len(views), err)
	}
}

// With a shard on every server (ec:3+2 on five), a left server's shard is
// rebuilt on a server that holds another one: the stripes keep their
// tolerance of any one more server lost.
func TestErasureCodedRebuildOnRemaining(t *testing.T) {
	ctx := context.Background()
	cl, servers := startPool(t, 5)
	s, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 1, TTL: time.Minute, Redundancy: pool.Redundancy{K: 3, M: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	ids, err := s.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	id := ids[0]
	io, _ := s.OpenIO()
	defer io.Close()
	ops := make([]remote.PageOp, 24)
	for p := range ops {
		b := make([]byte, 4096)
		pattern(b, byte(p*5+2))
		ops[p] = remote.PageOp{Slab: id, Off: uint64(p) * 4096 * 3, Buf: b}
	}
	if err := io.Write(ctx, ops); err != nil {
		t.Fatal(err)
	}
	shards, _ := s.Table().Group(id)
	server := func(sh int) pool.ServerID {
		reps, _ := s.Table().Replicas(shards[sh])
		return pool.ServerID(reps[len(reps)-1].Server)
	}
	gone := server(0)
	if err := cl.Leave(ctx, gone); err != nil {
		t.Fatal(err)
	}
	servers[gone].Close()
	if err := s.RenewOnce(ctx); err != nil {
		t.Fatalf("no rebuild on the four servers left: %v", err)
	}
	if host := server(0); host == gone {
		t.Fatalf("shard 0 still on %s", host)
	}
	readBack(t, io, ops, "rebuilt on a server with another shard")
	// Any one more server lost: the stripes still read.
	next := server(0)
	servers[next].Close()
	readBack(t, io, ops, "the doubled server lost too")
}
