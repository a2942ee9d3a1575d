package poolstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rmem/pager/poolstore"
	"rmem/pager/remote"
	"rmem/pager/slabio"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/memserver"
	"rmem/pool/pooltest"
	_ "rmem/rdma/tcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const slabSize = 2 << 20

// startPool starts a real pool in process with n memory servers
// (pooltest.Live) and returns its client and its servers by id.
func startPool(t *testing.T, n int) (*client.Client, map[pool.ServerID]*memserver.Server) {
	l := pooltest.StartLive(t, n, slabSize)
	return l.Client, l.Servers
}

// readBack reads ops' pages through io and fails the test (saying what)
// unless each comes back as written.
func readBack(t *testing.T, io remote.PageIO, ops []remote.PageOp, what string) {
	t.Helper()
	rd := make([]remote.PageOp, len(ops))
	for i, op := range ops {
		rd[i] = remote.PageOp{Slab: op.Slab, Off: op.Off, Buf: make([]byte, len(op.Buf))}
	}
	if err := io.Read(context.Background(), rd); err != nil {
		t.Fatal(err)
	}
	for i := range rd {
		if rd[i].Err != nil || string(rd[i].Buf) != string(ops[i].Buf) {
			t.Fatalf("%s: page %d: %v / data differs", what, i, rd[i].Err)
		}
	}
}

func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestLeaseSlabsAndMigration(t *testing.T) {
	ctx := context.Background()
	cl, servers := startPool(t, 4)
	s, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 1, TTL: time.Minute, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if s.SlabSize() != slabSize {
		t.Fatalf("slab size %d", s.SlabSize())
	}
	ids, err := s.Alloc(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	io, _ := s.OpenIO()
	defer io.Close()
	ops := make([]remote.PageOp, 0, 16)
	for _, id := range ids {
		for p := uint64(0); p < 8; p++ {
			b := make([]byte, 4096)
			pattern(b, byte(uint64(id)*8+p))
			ops = append(ops, remote.PageOp{Slab: id, Off: p * 4096 * 61, Buf: b})
		}
	}
	if err := io.Write(ctx, ops); err != nil {
		t.Fatal(err)
	}
	readBack(t, io, ops, "written")

	// Drain the server holding a replica of the first slab: the renewal
	// brings replica-drain, the store copies and reports.
	reps, _ := s.Table().Replicas(ids[0])
	victim := pool.ServerID(reps[0].Server)
	if _, err := cl.Drain(ctx, victim, true); err != nil {
		t.Fatal(err)
	}
	if err := s.RenewOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dv, err := cl.DrainStatus(ctx, victim)
	if err != nil || !dv.Done {
		t.Fatalf("drain of %s not done after a renewal: %+v %v", victim, dv, err)
	}
	if st := s.Stats(); st.Migrations == 0 {
		t.Fatalf("no migration: %+v", st)
	}
	servers[victim].Close() // its data is unreachable now
	readBack(t, io, ops, "after drain")

	// A server leaves without draining: replicas on it are lost; the store
	// restores redundancy from the survivors.
	reps, _ = s.Table().Replicas(ids[1])
	gone := pool.ServerID(reps[0].Server)
	if gone == victim {
		gone = pool.ServerID(reps[1].Server)
	}
	if err := cl.Leave(ctx, gone); err != nil {
		t.Fatal(err)
	}
	servers[gone].Close()
	if err := s.RenewOnce(ctx); err != nil {
		t.Fatal(err)
	}
	readBack(t, io, ops, "after a server left")
	for _, id := range ids {
		reps, _ := s.Table().Replicas(id)
		for _, r := range reps {
			if r.State != slabio.Healthy {
				t.Fatalf("slab %d replica %s is %v", id, r.Server, r.State)
			}
			if pool.ServerID(r.Server) == victim {
				t.Fatalf("slab %d still has a replica on drained %s", id, victim)
			}
		}
	}
	if err := s.Free(ctx, ids[:1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LeaseSlabs(ctx, s.Lease().ID); !errors.Is(err, pool.ErrNotFound) && !errors.Is(err, pool.ErrLeaseExpired) {
		t.Fatalf("lease after Close: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []poolstore.Options{
		{},
		{Pool: &client.Client{}},
		{Pool: &client.Client{}, Agent: "a", Replicas: 9},
		{Pool: &client.Client{}, Agent: "a", TTL: time.Millisecond},
	} {
		if err := o.Validate(); !errors.Is(err, poolstore.ErrOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// An agent killed or restarted leaves its lease alive until its TTL: the
// next agent takes it over with its slabs, whose data reads back; a lease
// that is gone gives a new one.
func TestAdoptLease(t *testing.T) {
	ctx := context.Background()
	cl, _ := startPool(t, 2)
	s1, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := s1.Alloc(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	io1, _ := s1.OpenIO()
	page := make([]byte, 4096)
	pattern(page, 9)
	ops := []remote.PageOp{{Slab: ids[1], Off: 5 * 4096, Buf: page}}
	if err := io1.Write(ctx, ops); err != nil || ops[0].Err != nil {
		t.Fatal(err, ops[0].Err)
	}
	io1.Close()
	s1.Abandon() // killed: the lease lives on

	// The next agent is another process: its pool client knows no secret
	// but the one it read from the journal (Options.AdoptSecret).
	fresh := func() *client.Client {
		c, err := client.New(cl.URL(), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseIdleConnections)
		return c
	}
	if s1.Lease().Secret == "" {
		t.Fatal("the lease has no secret")
	}
	if _, err := poolstore.Open(ctx, poolstore.Options{Pool: fresh(), Agent: "memagent-test", PID: 2, TTL: time.Minute,
		Adopt: s1.Lease().ID}); !errors.Is(err, pool.ErrForbidden) {
		t.Fatalf("taking over a lease without its secret: %v, want %v", err, pool.ErrForbidden)
	}
	s2, err := poolstore.Open(ctx, poolstore.Options{Pool: fresh(), Agent: "memagent-test", PID: 2, TTL: time.Minute,
		Adopt: s1.Lease().ID, AdoptSecret: s1.Lease().Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	if !s2.Adopted() || s2.Lease().ID != s1.Lease().ID || len(s2.Slabs()) != 2 {
		t.Fatalf("adopted %v lease %s (want %s) slabs %v", s2.Adopted(), s2.Lease().ID, s1.Lease().ID, s2.Slabs())
	}
	io2, _ := s2.OpenIO()
	defer io2.Close()
	rd := []remote.PageOp{{Slab: ids[1], Off: 5 * 4096, Buf: make([]byte, 4096)}}
	if err := io2.Read(ctx, rd); err != nil || rd[0].Err != nil || string(rd[0].Buf) != string(page) {
		t.Fatalf("the adopted slab does not read back: %v %v", err, rd[0].Err)
	}

	s3, err := poolstore.Open(ctx, poolstore.Options{Pool: cl, Agent: "memagent-test", PID: 3, TTL: time.Minute, Adopt: "no-such-lease"})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close(ctx)
	if s3.Adopted() || s3.Lease().ID == "" || len(s3.Slabs()) != 0 {
		t.Fatalf("a gone lease: adopted %v lease %q slabs %v", s3.Adopted(), s3.Lease().ID, s3.Slabs())
	}
}

// slowReplace is a pool whose Replace waits, as one involving a stopped
// memory server does.
type slowReplace struct {
	*client.Client
	wait time.Duration
}

func (p slowReplace) Replace(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) (pool.ReplicaView, error) {
	select {
	case <-time.After(p.wait):
	case <-ctx.Done():
		return pool.ReplicaView{}, ctx.Err()
	}
	return p.Client.Replace(ctx, id, sid, from)
}

// Renewals go on while a repair waits on a server: before, they waited
// behind it in one loop, and a lease not renewed within its TTL lost every
// slab (seen with a memory server stopped by SIGSTOP).
func TestRenewalsDoNotWaitForRepairs(t *testing.T) {
	ctx := context.Background()
	cl, _ := startPool(t, 3)
	const ttl = 300 * time.Millisecond
	s, err := poolstore.Open(ctx, poolstore.Options{Pool: slowReplace{cl, 4 * ttl}, Agent: "memagent-test", PID: 1, TTL: ttl, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	ids, err := s.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	reps, _ := s.Table().Replicas(ids[0])
	if _, err := cl.Drain(ctx, pool.ServerID(reps[0].Server), true); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().Renewals
	time.Sleep(3 * ttl) // the repair waits 4 TTLs in Replace
	if got := s.Stats().Renewals - before; got < 5 {
		t.Fatalf("%d renewals in 3 TTLs while a repair waited (want about 9)", got)
	}
	if _, err := cl.LeaseSlabs(ctx, s.Lease().ID); err != nil {
		t.Fatalf("the lease did not survive the slow repair: %v", err)
	}
}
