package coord_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"rmem/pool"
	"rmem/pool/coord"
	"rmem/pool/pooltest"
	"rmem/pool/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const slabSize = 16 << 20

type env struct {
	t     *testing.T
	c     *coord.Coordinator
	clock *pooltest.Clock
	ss    *pooltest.Servers
	st    store.Store
	infos map[pool.ServerID]pool.ServerInfo
}

func newEnv(t *testing.T, st store.Store) *env { return newEnvWith(t, st, 0) }

// newEnvWith is newEnv with the coordinator's call timeout (0: the default).
func newEnvWith(t *testing.T, st store.Store, callTimeout time.Duration) *env {
	t.Helper()
	e := &env{t: t, clock: &pooltest.Clock{}, ss: &pooltest.Servers{}, st: st, infos: map[pool.ServerID]pool.ServerInfo{}}
	e.openWith(callTimeout)
	return e
}

func (e *env) open() { e.openWith(0) }

// openWith opens the coordinator with a call timeout (0: the default).
func (e *env) openWith(callTimeout time.Duration) {
	e.t.Helper()
	c, err := coord.New(coord.Options{Store: e.st, Dialer: e.ss, SlabSize: slabSize, Clock: e.clock,
		HeartbeatTimeout: time.Second, Seed: 42, CallTimeout: callTimeout})
	if err != nil {
		e.t.Fatal(err)
	}
	e.c = c
}

func (e *env) addServer(id string, slabs int, domain string) {
	e.t.Helper()
	info := e.ss.Add(pool.ServerID(id), slabs, slabSize, domain)
	if _, err := e.c.Register(info); err != nil {
		e.t.Fatal(err)
	}
	e.infos[info.ID] = info
}

func (e *env) heartbeatAll() {
	e.t.Helper()
	for id, info := range e.infos {
		if err := e.c.Heartbeat(id, pool.Heartbeat{Instance: info.Instance}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) lease(agent string, ttl time.Duration) pool.LeaseID {
	e.t.Helper()
	l, err := e.c.CreateLease(pool.CreateLeaseRequest{Agent: agent, Node: "n1", PID: 1, TTL: pool.Duration(ttl)})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.ID
}

// tick runs a sweep and waits for the frees it started.
func (e *env) tick(ctx context.Context) {
	e.c.Tick(ctx)
	e.c.WaitFrees()
}

// liveKeys counts the keys all servers hold.
func (e *env) liveKeys() int {
	n := 0
	for id := range e.infos {
		n += len(e.ss.Get(id).Keys())
	}
	return n
}

func TestAllocateDistinctServersAndKeysWork(t *testing.T) {
	e := newEnv(t, store.NewMem())
	for i := range 4 {
		e.addServer(fmt.Sprintf("s%d", i), 8, "")
	}
	l := e.lease("a", time.Minute)
	slabs, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 6, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(slabs) != 6 {
		t.Fatalf("%d slabs", len(slabs))
	}
	perServer := map[pool.ServerID]int{}
	for _, s := range slabs {
		seen := map[pool.ServerID]bool{}
		for _, r := range s.Replicas {
			if seen[r.Server] {
				t.Fatalf("slab %d has two replicas on %s", s.ID, r.Server)
			}
			seen[r.Server] = true
			perServer[r.Server]++
			// The key handed out is the one the server holds for that slab.
			if got := e.ss.Get(r.Server).Keys()[r.Index]; got != r.Key || r.Key == "" {
				t.Fatalf("replica key %q, server has %q", r.Key, got)
			}
			if r.Length != slabSize || r.Addrs["mem"] != string(r.Server) || r.State != "ok" {
				t.Fatalf("replica view %+v", r)
			}
		}
	}
	for id, n := range perServer {
		if n > 8 {
			t.Fatalf("%s holds %d replicas, capacity 8", id, n)
		}
	}
	st := e.c.Status()
	if st.Used != 18*slabSize || st.Capacity != 32*slabSize || st.Slabs != 6 || st.SlabsHealthy != 6 || st.Agents != 1 {
		t.Fatalf("status %+v", st)
	}
}

func TestCapacityRespectedAndBeyondPool(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 4, "")
	e.addServer("s1", 4, "")
	l := e.lease("a", time.Minute)
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 4, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	_, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 1, Replicas: 1})
	if !errors.Is(err, pool.ErrNoCapacity) {
		t.Fatalf("allocation beyond the pool: %v", err)
	}
	if e.liveKeys() != 8 {
		t.Fatalf("%d live keys, want 8", e.liveKeys())
	}
}

func TestAllOrNothing(t *testing.T) {
	e := newEnv(t, store.NewMem())
	for i := range 3 {
		e.addServer(fmt.Sprintf("s%d", i), 4, "")
	}
	l := e.lease("a", time.Minute)
	before := e.c.Status()
	// Three replicas each: every server is involved; one fails to grant.
	e.ss.Get("s1").Fail(errors.New("disk on fire"))
	_, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 2, Replicas: 3})
	if !errors.Is(err, pool.ErrGrantFailed) {
		t.Fatalf("want ErrGrantFailed, got %v", err)
	}
	e.c.WaitFrees() // the grants are revoked behind the answer
	if n := e.liveKeys(); n != 0 {
		t.Fatalf("%d keys leaked on the servers that granted", n)
	}
	if after := e.c.Status(); after != before {
		t.Fatalf("status changed by a failed allocation:\n%+v\n%+v", before, after)
	}
	// Too many replicas for the pool's servers: refused up front.
	e.ss.Get("s1").Fail(nil)
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 1, Replicas: 4}); !errors.Is(err, pool.ErrNoCapacity) {
		t.Fatalf("4 replicas on 3 servers: %v", err)
	}
	// And the pool is whole again.
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 4, Replicas: 3}); err != nil {
		t.Fatalf("after failures the full pool should be allocatable: %v", err)
	}
}

// A server that fails its grants (killed, not yet past the heartbeat
// timeout) does not fail allocations the other servers can take.
func TestAllocateAvoidsServerThatFailsGrants(t *testing.T) {
	e := newEnv(t, store.NewMem())
	for i := range 3 {
		e.addServer(fmt.Sprintf("s%d", i), 8, "")
	}
	l := e.lease("a", time.Minute)
	e.ss.Get("s1").Fail(errors.New("connection refused"))
	for range 6 {
		views, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 1, Replicas: 2})
		if err != nil {
			t.Fatalf("allocation with two healthy servers: %v", err)
		}
		for _, r := range views[0].Replicas {
			if r.Server == "s1" {
				t.Fatalf("replica placed on the server that fails its grants: %+v", views[0])
			}
		}
	}
	if n := len(e.ss.Get("s1").Keys()); n != 0 {
		t.Fatalf("%d keys on the failing server", n)
	}
	if sv, _ := e.c.Server("s1"); sv.FreeSlabs != 8 {
		t.Fatalf("failing server has %d free slabs of 8: a failed attempt leaked a reservation", sv.FreeSlabs)
	}
}

func TestFailureDomains(t *testing.T) {
	e := newEnv(t, store.NewMem())
	for i := range 6 {
		e.addServer(fmt.Sprintf("s%d", i), 10, fmt.Sprintf("rack%d", i%2))
	}
	l := e.lease("a", time.Minute)
	slabs, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 10, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	dom := func(id pool.ServerID) string { return e.infos[id].Domain }
	for _, s := range slabs {
		if dom(s.Replicas[0].Server) == dom(s.Replicas[1].Server) {
			t.Fatalf("slab %d: both replicas in %s", s.ID, dom(s.Replicas[0].Server))
		}
	}
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 1, Replicas: 3}); !errors.Is(err, pool.ErrNoCapacity) {
		t.Fatalf("3 replicas over 2 racks: %v", err)
	}
}

func TestLeaseExpiryFrees(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 4, "")
	e.addServer("s1", 4, "")
	l := e.lease("a", 10*time.Second)
	slabs, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 2, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Renewals keep it alive past its first TTL.
	for range 3 {
		e.clock.Advance(6 * time.Second)
		e.heartbeatAll()
		if _, err := e.c.Renew(l, pool.RenewRequest{}); err != nil {
			t.Fatal(err)
		}
		e.tick(context.Background())
	}
	if e.liveKeys() != 4 {
		t.Fatalf("renewed lease lost keys: %d", e.liveKeys())
	}
	// What the agent reports with its renewal shows in the views.
	if _, err := e.c.Renew(l, pool.RenewRequest{Used: 12345, NoRoom: true}); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.c.Lease(l); v.Used != 12345 || !v.NoRoom || v.Bytes != 2*slabSize {
		t.Fatalf("lease view after a report: %+v", v)
	}
	if st := e.c.Status(); st.AgentsNoRoom != 1 {
		t.Fatalf("status after a no-room report: %+v", st)
	}
	e.clock.Advance(11 * time.Second)
	e.heartbeatAll()
	e.tick(context.Background())
	if n := e.liveKeys(); n != 0 {
		t.Fatalf("%d keys still live after expiry", n)
	}
	for _, s := range slabs {
		for _, r := range s.Replicas {
			if e.ss.Get(r.Server).Zeroed(r.Index) == 0 {
				t.Fatalf("slab %s/%d not zeroed", r.Server, r.Index)
			}
		}
	}
	if _, err := e.c.Renew(l, pool.RenewRequest{}); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("renewing an expired lease: %v", err)
	}
	if st := e.c.Status(); st.Used != 0 || st.Agents != 0 || st.Slabs != 0 {
		t.Fatalf("status after expiry %+v", st)
	}
}

func TestExpiredButNotSweptCannotRenew(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 4, "")
	l := e.lease("a", time.Second)
	e.clock.Advance(2 * time.Second)
	if _, err := e.c.Renew(l, pool.RenewRequest{}); !errors.Is(err, pool.ErrLeaseExpired) {
		t.Fatalf("got %v", err)
	}
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 1, Replicas: 1}); !errors.Is(err, pool.ErrLeaseExpired) {
		t.Fatalf("allocate on expired lease: %v", err)
	}
}

func TestDeadServerReported(t *testing.T) {
	e := newEnv(t, store.NewMem())
	for i := range 3 {
		e.addServer(fmt.Sprintf("s%d", i), 4, "")
	}
	l := e.lease("a", time.Minute)
	slabs, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 3, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(800 * time.Millisecond)
	for _, id := range []pool.ServerID{"s0", "s2"} {
		e.c.Heartbeat(id, pool.Heartbeat{Instance: e.infos[id].Instance})
	}
	e.clock.Advance(800 * time.Millisecond) // s1: 1.6s > 1s timeout
	e.tick(context.Background())
	sv, _ := e.c.Server("s1")
	if sv.State != pool.ServerDead {
		t.Fatalf("s1 is %s", sv.State)
	}
	r, err := e.c.Renew(l, pool.RenewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, s := range slabs {
		if s.HasServerView("s1") {
			want++
		}
	}
	got := 0
	for _, ev := range r.Events {
		if ev.Type != pool.EventReplicaLost || ev.Server != "s1" {
			t.Fatalf("unexpected event %+v", ev)
		}
		got++
	}
	if got != want || want == 0 {
		t.Fatalf("%d lost-replica events, want %d", got, want)
	}
	if st := e.c.Status(); st.ServersDown != 1 || st.SlabsDegraded != want {
		t.Fatalf("status %+v", st)
	}
	// The dead server gets no new replicas.
	more, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 2, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range more {
		if s.HasServerView("s1") {
			t.Fatal("placed on a dead server")
		}
	}
	// It comes back (same instance): up again, events stop.
	e.heartbeatAll()
	if r, _ := e.c.Renew(l, pool.RenewRequest{}); len(r.Events) != 0 {
		t.Fatalf("events after recovery: %+v", r.Events)
	}
}

func TestServerRestartLosesReplicas(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	e.addServer("s1", 2, "")
	l := e.lease("a", time.Minute)
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 2, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	info := e.infos["s0"]
	// A second node claiming the id while the old instance is live (and
	// still answers at its control URL) is refused: two nodes with one id
	// must not wipe each other's replicas.
	other := info
	other.Instance = "another-node"
	if _, err := e.c.Register(other); !errors.Is(err, pool.ErrConflict) {
		t.Fatalf("second live instance of s0: %v", err)
	}
	info.Instance = e.ss.Get("s0").Restart()
	if err := e.c.Heartbeat("s0", pool.Heartbeat{Instance: info.Instance}); !errors.Is(err, pool.ErrStaleInstance) {
		t.Fatalf("heartbeat of a new instance before registering: %v", err)
	}
	// The restarted server answers at the old control URL with its new
	// instance: it joins at once, within the heartbeat timeout.
	if _, err := e.c.Register(info); err != nil {
		t.Fatalf("restarted server refused while its old instance looked live: %v", err)
	}
	e.infos["s0"] = info
	r, _ := e.c.Renew(l, pool.RenewRequest{})
	if len(r.Events) != 2 {
		t.Fatalf("want 2 lost replicas, got %+v", r.Events)
	}
	// The new instance's memory is all free again.
	if sv, _ := e.c.Server("s0"); sv.FreeSlabs != 2 {
		t.Fatalf("restarted server has %d free slabs", sv.FreeSlabs)
	}
}

func TestDrainProgress(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	for i := range 3 {
		e.addServer(fmt.Sprintf("s%d", i), 4, "")
	}
	l := e.lease("a", time.Minute)
	if _, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 4, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.SetDrain("s0", true); err != nil {
		t.Fatal(err)
	}
	d, _ := e.c.Drain("s0")
	if d.Done || d.Replicas == 0 {
		t.Fatalf("drain at start: %+v", d)
	}
	r, _ := e.c.Renew(l, pool.RenewRequest{})
	if len(r.Events) != d.Replicas {
		t.Fatalf("%d drain events for %d replicas", len(r.Events), d.Replicas)
	}
	// Act as the agent: replace each replica on s0, then report it moved.
	for i, ev := range r.Events {
		if ev.Type != pool.EventReplicaDrain {
			t.Fatalf("event %+v", ev)
		}
		nr, err := e.c.Replace(ctx, l, ev.Slab, ev.Server)
		if err != nil {
			t.Fatal(err)
		}
		if nr.Server == "s0" {
			t.Fatal("replacement placed on the draining server")
		}
		if err := e.c.Migrated(ctx, l, ev.Slab, ev.Server); err != nil {
			t.Fatal(err)
		}
		if d, _ := e.c.Drain("s0"); d.Replicas != len(r.Events)-i-1 {
			t.Fatalf("progress %+v after %d moves", d, i+1)
		}
	}
	d, _ = e.c.Drain("s0")
	if !d.Done {
		t.Fatalf("drain not done: %+v", d)
	}
	e.c.WaitFrees()
	if n := len(e.ss.Get("s0").Keys()); n != 0 {
		t.Fatalf("drained server still has %d keys", n)
	}
	for _, s := range e.c.Slabs(coord.SlabFilter{Lease: l}) {
		if len(s.Replicas) != 2 {
			t.Fatalf("slab %d has %d replicas after migration", s.ID, len(s.Replicas))
		}
	}
}

func TestBadRequests(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	l := e.lease("a", time.Minute)
	slabs, _ := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 1, Replicas: 1})
	info := e.ss.Add("odd", 2, 4096, "")
	var fe *pool.FieldError
	if _, err := e.c.Register(info); !errors.As(err, &fe) || fe.Field != "slab_size" {
		t.Fatalf("slab size mismatch: %v", err)
	}
	for name, err := range map[string]error{
		"unknown server heartbeat": e.c.Heartbeat("nope", pool.Heartbeat{Instance: "x"}),
		"unknown server drain":     e.c.SetDrain("nope", true),
		"unknown lease delete":     e.c.DeleteLease(ctx, "nope"),
		"unknown slab":             e.c.FreeSlab(ctx, l, 999),
		"other lease's slab":       e.c.FreeSlab(ctx, e.lease("b", time.Minute), slabs[0].ID),
	} {
		if !errors.Is(err, pool.ErrNotFound) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := e.c.Allocate(ctx, "nope", pool.AllocateRequest{Slabs: 1, Replicas: 1}); !errors.Is(err, pool.ErrNotFound) {
		t.Errorf("allocate on unknown lease: %v", err)
	}
	if err := e.c.Migrated(ctx, l, slabs[0].ID, "s0"); !errors.Is(err, pool.ErrConflict) {
		t.Errorf("dropping the last replica: %v", err)
	}
	if _, err := e.c.Replace(ctx, l, slabs[0].ID, "s9"); !errors.As(err, &fe) || fe.Field != "server" {
		t.Errorf("replacing a replica that does not exist: %v", err)
	}
}

// A server whose old instance cannot be asked is refused until that
// instance misses its heartbeats, unless nothing listens at its control URL.
func TestRegisterProbesOldInstance(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	info := e.infos["s0"]
	info.Instance = "new-instance"
	e.ss.Get("s0").Fail(context.DeadlineExceeded) // partitioned: no answer
	if _, err := e.c.Register(info); !errors.Is(err, pool.ErrConflict) {
		t.Fatalf("old instance unreachable: %v", err)
	}
	e.ss.Get("s0").Fail(fmt.Errorf("dial: %w", syscall.ECONNREFUSED))
	if _, err := e.c.Register(info); err != nil {
		t.Fatalf("nothing listening at the old control URL: %v", err)
	}
	if sv, _ := e.c.Server("s0"); sv.Instance != "new-instance" || sv.State != pool.ServerUp {
		t.Fatalf("after rejoining: %+v", sv)
	}
	// Past the timeout no probe is needed.
	info.Instance = "third"
	e.ss.Get("s0").Fail(context.DeadlineExceeded)
	e.clock.Advance(1100 * time.Millisecond)
	if _, err := e.c.Register(info); err != nil {
		t.Fatal(err)
	}
}

// After a restart the coordinator does not know which servers are alive:
// they are "unknown", and their slabs neither healthy nor lost, until they
// heartbeat (or miss the timeout and are dead).
func TestRestartUnknownUntilHeard(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	e.addServer("s1", 2, "")
	l := e.lease("a", time.Minute)
	if _, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 2, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	if st := e.c.Status(); st.ServersUp != 2 || st.SlabsHealthy != 2 {
		t.Fatalf("before the restart: %+v", st)
	}
	e.open() // a new coordinator process on the same store
	states := func() string {
		var out []string
		for _, s := range e.c.Servers() {
			out = append(out, fmt.Sprintf("%s=%s", s.ID, s.State))
		}
		for _, sl := range e.c.Slabs(coord.SlabFilter{}) {
			for _, r := range sl.Replicas {
				out = append(out, fmt.Sprintf("%d/%s=%s", sl.ID, r.Server, r.State))
			}
		}
		return fmt.Sprint(out)
	}
	if got, want := states(), "[s0=unknown s1=unknown 1/s0=unknown 1/s1=unknown 2/s0=unknown 2/s1=unknown]"; got != want {
		t.Fatalf("after the restart: %s, want %s", got, want)
	}
	st := e.c.Status()
	if st.ServersUp != 0 || st.ServersUnknown != 2 || st.SlabsHealthy != 0 || st.SlabsUnknown != 2 || st.SlabsLost != 0 {
		t.Fatalf("status after the restart: %+v", st)
	}
	if sv, _ := e.c.Server("s0"); !sv.LastHeartbeat.IsZero() {
		t.Fatalf("a heartbeat shown before any arrived: %v", sv.LastHeartbeat)
	}
	// No event: the agent is not told its replicas are lost.
	if r, _ := e.c.Renew(l, pool.RenewRequest{}); len(r.Events) != 0 {
		t.Fatalf("events for servers not heard from: %+v", r.Events)
	}
	// s0 heartbeats; s1 stays silent past the timeout and is dead.
	e.clock.Advance(600 * time.Millisecond)
	if err := e.c.Heartbeat("s0", pool.Heartbeat{Instance: e.infos["s0"].Instance}); err != nil {
		t.Fatal(err)
	}
	if got, want := states(), "[s0=up s1=unknown 1/s0=ok 1/s1=unknown 2/s0=ok 2/s1=unknown]"; got != want {
		t.Fatalf("after s0's heartbeat: %s, want %s", got, want)
	}
	if st := e.c.Status(); st.ServersUp != 1 || st.ServersUnknown != 1 || st.SlabsUnknown != 2 {
		t.Fatalf("status after s0's heartbeat: %+v", st)
	}
	e.clock.Advance(600 * time.Millisecond)
	e.c.Heartbeat("s0", pool.Heartbeat{Instance: e.infos["s0"].Instance})
	e.tick(ctx)
	if got, want := states(), "[s0=up s1=dead 1/s0=ok 1/s1=lost 2/s0=ok 2/s1=lost]"; got != want {
		t.Fatalf("after the timeout: %s, want %s", got, want)
	}
	if st := e.c.Status(); st.ServersUp != 1 || st.ServersDown != 1 || st.ServersUnknown != 0 || st.SlabsDegraded != 2 || st.SlabsUnknown != 0 {
		t.Fatalf("status after the timeout: %+v", st)
	}
	// Replicas on a server not heard from, the others lost: unknown, not lost.
	e.open()
	e.c.Heartbeat("s1", pool.Heartbeat{Instance: "gone"}) // a stale heartbeat is not hearing from s1
	if st := e.c.Status(); st.SlabsLost != 0 || st.SlabsUnknown != 2 {
		t.Fatalf("s0 unknown, s1 dead: %+v", st)
	}
}

// A drain that no server can take says so.
func TestDrainBlocked(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 4, "")
	e.addServer("s1", 4, "")
	l := e.lease("a", time.Minute)
	if _, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 2, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	e.c.SetDrain("s0", true)
	d, _ := e.c.Drain("s0")
	if d.Replicas != 2 || d.Blocked != 2 || !strings.Contains(d.Reason, "nowhere to go") {
		t.Fatalf("drain with no other server free: %+v", d)
	}
	// A server that cannot take new replicas does not help.
	e.addServer("s2", 4, "")
	e.c.SetDrain("s2", true)
	if d, _ = e.c.Drain("s0"); d.Blocked != 2 {
		t.Fatalf("the only other server drains too: %+v", d)
	}
	e.c.SetDrain("s2", false)
	if d, _ = e.c.Drain("s0"); d.Blocked != 0 || d.Reason != "" {
		t.Fatalf("s2 can take them: %+v", d)
	}
}

// Restarting the coordinator on the same bbolt file loses nothing.
func TestRestartKeepsState(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, st)
	for i := range 3 {
		e.addServer(fmt.Sprintf("s%d", i), 4, "")
	}
	l := e.lease("a", time.Minute)
	if _, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 3, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	e.c.SetDrain("s2", true)
	beforeStatus, beforeSlabs, beforeLeases := e.c.Status(), e.c.Slabs(coord.SlabFilter{}), e.c.Leases()
	st.Close()

	if e.st, err = store.OpenBolt(dir); err != nil {
		t.Fatal(err)
	}
	defer e.st.Close()
	e.open()
	e.heartbeatAll()
	if got := e.c.Status(); got != beforeStatus {
		t.Fatalf("status after restart\n%+v\nwant\n%+v", got, beforeStatus)
	}
	if got := e.c.Slabs(coord.SlabFilter{}); fmt.Sprint(got) != fmt.Sprint(beforeSlabs) {
		t.Fatalf("slabs after restart\n%v\nwant\n%v", got, beforeSlabs)
	}
	if got := e.c.Leases(); len(got) != 1 || got[0].ID != beforeLeases[0].ID || got[0].Slabs != 3 {
		t.Fatalf("leases after restart %+v", got)
	}
	// New slabs get new ids.
	more, err := e.c.Allocate(context.Background(), l, pool.AllocateRequest{Slabs: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	if more[0].ID <= beforeSlabs[len(beforeSlabs)-1].ID {
		t.Fatalf("slab id %d reused", more[0].ID)
	}
}

// A free the server does not confirm keeps the slab out of use until a
// retry succeeds.
func TestFailedFreeIsRetried(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 1, "")
	l := e.lease("a", time.Minute)
	slabs, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.ss.Get("s0").Fail(errors.New("unreachable"))
	if err := e.c.FreeSlab(ctx, l, slabs[0].ID); err != nil {
		t.Fatal(err)
	}
	e.c.WaitFrees()
	if sv, _ := e.c.Server("s0"); sv.FreeSlabs != 0 {
		t.Fatal("slab reusable before the server confirmed the free")
	}
	e.ss.Get("s0").Fail(nil)
	e.tick(ctx)
	if sv, _ := e.c.Server("s0"); sv.FreeSlabs != 1 {
		t.Fatal("retried free did not release the slab")
	}
	if len(e.ss.Get("s0").Keys()) != 0 {
		t.Fatal("key not revoked")
	}
}

// Migrated answers without waiting for the free of the replica it drops:
// that server is often the failing one, and a stopped server's free waits
// out the call timeout while the agent waits for the answer (this lost the
// agent's lease in TestEtcdChaosServerPaused). The free still happens.
func TestMigratedDoesNotWaitForTheFree(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	for _, id := range []string{"s0", "s1", "s2"} {
		e.addServer(id, 2, "")
	}
	l := e.lease("a", time.Minute)
	slabs, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 1, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	from := slabs[0].Replicas[0].Server
	if _, err := e.c.Replace(ctx, l, slabs[0].ID, from); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	e.ss.Get(from).Block(release)
	done := make(chan error, 1)
	go func() { done <- e.c.Migrated(ctx, l, slabs[0].ID, from) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("Migrated waited for the blocked server's free")
	}
	if n := len(e.ss.Get(from).Keys()); n != 1 {
		t.Fatalf("%s holds %d keys while its free is blocked, want 1", from, n)
	}
	close(release)
	e.c.WaitFrees()
	if n := len(e.ss.Get(from).Keys()); n != 0 {
		t.Fatalf("%s holds %d keys after the free ran, want 0", from, n)
	}
}

// A sweep does not wait for the frees it starts: with a free to a server
// that stopped answering (not dead yet) in flight, the next sweep still
// marks a silent server dead. (The call timeout is an hour: a sweep that
// waited would hang.)
func TestSweepDoesNotWaitForFrees(t *testing.T) {
	ctx := context.Background()
	e := newEnvWith(t, store.NewMem(), time.Hour)
	e.addServer("s0", 2, "")
	e.addServer("s1", 2, "")
	l := e.lease("a", time.Second)
	if _, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 1, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	e.ss.Get("s0").Block(release)
	e.clock.Advance(900 * time.Millisecond)
	e.heartbeatAll()
	e.clock.Advance(200 * time.Millisecond) // the lease expired: its frees start
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.c.Tick(ctx)
		e.clock.Advance(2 * time.Second) // no heartbeats since: both servers are silent
		e.c.Tick(ctx)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a sweep waited for a blocked server's free")
	}
	if sv, _ := e.c.Server("s1"); sv.State != pool.ServerDead {
		t.Fatalf("silent server s1 is %s after the second sweep", sv.State)
	}
}

// FreeSlab and DeleteLease answer once the servers have freed, but a
// server that stopped answering (not dead yet) holds them for freeWait at
// most, not for the call timeout: the free goes on behind the answer, and
// happens when the server is back. (The agent's other requests wait
// behind one that waits.)
func TestFreesWaitForABlockedServerBriefly(t *testing.T) {
	ctx := context.Background()
	e := newEnvWith(t, store.NewMem(), time.Hour)
	e.addServer("s0", 4, "")
	l := e.lease("a", time.Minute)
	slabs, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 2, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.FreeSlab(ctx, l, slabs[0].ID); err != nil {
		t.Fatal(err)
	}
	if sv, _ := e.c.Server("s0"); sv.FreeSlabs != 3 {
		t.Fatalf("%d free slabs once FreeSlab answered, want 3: it did not wait for the server", sv.FreeSlabs)
	}
	release := make(chan struct{})
	e.ss.Get("s0").Block(release)
	done := make(chan error, 2)
	go func() {
		done <- e.c.FreeSlab(ctx, l, slabs[1].ID)
		done <- e.c.DeleteLease(ctx, l)
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request waited for a blocked server's free")
		}
	}
	close(release)
	e.c.WaitFrees()
	if sv, _ := e.c.Server("s0"); sv.FreeSlabs != 4 {
		t.Fatalf("%d free slabs after the server came back, want 4", sv.FreeSlabs)
	}
	if n := e.liveKeys(); n != 0 {
		t.Fatalf("%d keys left on the server", n)
	}
}

// Close waits for a free running behind a sweep or a request.
func TestCloseWaitsForFrees(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	l := e.lease("a", time.Second)
	if _, err := e.c.Allocate(ctx, l, pool.AllocateRequest{Slabs: 1, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	e.ss.Get("s0").Block(release)
	e.clock.Advance(900 * time.Millisecond)
	e.heartbeatAll()
	e.clock.Advance(200 * time.Millisecond)
	e.c.Tick(ctx) // the lease expired: its free blocks
	closed := make(chan struct{})
	go func() { defer close(closed); e.c.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned with a free in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	if n := len(e.ss.Get("s0").Keys()); n != 0 {
		t.Fatalf("s0 holds %d keys: the free in flight did not finish", n)
	}
}

// RoutineSweep does Tick's work on its own and stops with its context.
func TestRoutineSweep(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	l := e.lease("a", time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.c.RoutineSweep(ctx, time.Millisecond) }()
	e.clock.Advance(2 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := e.c.Lease(l); errors.Is(err, pool.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not end the expired lease")
		}
		time.Sleep(time.Millisecond)
	}
	// The jump of the clock was a stall of the sweeper's (TestSweepStall):
	// the silent server dies a timeout of sweeping later.
	if !sweepUntilDead(e, "s0") {
		sv, _ := e.c.Server("s0")
		t.Fatalf("silent server is %s", sv.State)
	}
	cancel()
	<-done
}

// sweepUntilDead moves e's clock on 100 ms at a time, giving the sweeper
// (RoutineSweep every ms) time to run between steps, until server id is
// dead (true) or 10 s have passed.
func sweepUntilDead(e *env, id pool.ServerID) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if sv, _ := e.c.Server(id); sv.State == pool.ServerDead {
			return true
		}
		e.clock.Advance(100 * time.Millisecond)
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// A stall of the coordinator itself (its clock jumps between two sweeps:
// a loaded machine, a long GC or fsync) kills no server: none could be
// heard meanwhile. A server silent for a heartbeat timeout after it dies
// all the same. TestMemagentRun/fork lost its pages in CI so: the memd
// that was both coordinator and memory server stood still for 3 s, then
// declared its own memory server dead, 200 ms before it heartbeated again.
func TestSweepStall(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 2, "")
	e.addServer("s1", 2, "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.c.RoutineSweep(ctx, time.Millisecond) }()
	defer func() { cancel(); <-done }()
	time.Sleep(20 * time.Millisecond) // a few sweeps at the pace
	e.clock.Advance(3 * time.Second)  // the stall: no heartbeat got in
	time.Sleep(20 * time.Millisecond) // the sweeps after it
	for _, id := range []pool.ServerID{"s0", "s1"} {
		if sv, _ := e.c.Server(id); sv.State != pool.ServerUp {
			t.Fatalf("%s is %s after the coordinator's own stall, want up", id, sv.State)
		}
	}
	// s1 heartbeats from now on, s0 stays silent: s0 dies, s1 does not.
	stop := make(chan struct{})
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				e.c.Heartbeat("s1", pool.Heartbeat{Instance: e.infos["s1"].Instance})
			}
		}
	}()
	dead := sweepUntilDead(e, "s0")
	close(stop)
	<-beat
	if !dead {
		t.Fatal("a server silent after the stall did not die")
	}
	if sv, _ := e.c.Server("s1"); sv.State != pool.ServerUp {
		t.Fatalf("s1, heartbeating, is %s", sv.State)
	}
}

// A stall of the coordinator longer than a lease's TTL expires no lease:
// the agent's renewals could not get in. A renewal that comes in before the
// sweeper runs again is taken too. A lease not renewed after the stall
// expires a TTL later all the same.
func TestSweepStallKeepsLeases(t *testing.T) {
	e := newEnv(t, store.NewMem())
	e.addServer("s0", 4, "")
	kept := e.lease("kept", 2*time.Second)
	gone := e.lease("gone", 2*time.Second)
	if _, err := e.c.Allocate(context.Background(), gone, pool.AllocateRequest{Slabs: 1, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.c.RoutineSweep(ctx, time.Hour) }() // its pace, and no sweep of its own
	defer func() { cancel(); <-done }()
	for e.c.SweepPace() == 0 {
		time.Sleep(time.Millisecond)
	}
	e.tick(context.Background())               // the last sweep before the stall
	e.clock.Advance(time.Hour + 3*time.Second) // the stall: past the TTL and the pace
	if _, err := e.c.Renew(kept, pool.RenewRequest{}); err != nil {
		t.Fatalf("renewing after the coordinator's own stall: %v", err)
	}
	e.tick(context.Background())
	for _, id := range []pool.LeaseID{kept, gone} {
		if _, err := e.c.Lease(id); err != nil {
			t.Fatalf("lease %s after the stall: %v", id, err)
		}
	}
	e.clock.Advance(1500 * time.Millisecond)
	if _, err := e.c.Renew(kept, pool.RenewRequest{}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(1500 * time.Millisecond) // gone: 3 s since the stall, TTL 2 s
	e.heartbeatAll()
	e.tick(context.Background())
	if _, err := e.c.Lease(gone); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("a lease not renewed for a TTL after the stall: %v", err)
	}
	if _, err := e.c.Lease(kept); err != nil {
		t.Fatalf("a lease renewed after the stall: %v", err)
	}
}

// A lease's secret is checked, stored as a hash only, and survives a
// coordinator restart.
func TestLeaseSecretPersisted(t *testing.T) {
	st := store.NewMem()
	e := newEnv(t, st)
	l, err := e.c.CreateLease(pool.CreateLeaseRequest{Agent: "a", TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Secret) != 64 {
		t.Fatalf("secret %q", l.Secret)
	}
	check := func(when string) {
		t.Helper()
		if err := e.c.CheckLeaseSecret(l.ID, l.Secret); err != nil {
			t.Errorf("%s: the right secret: %v", when, err)
		}
		for _, wrong := range []string{"", "x", l.Secret[:63]} {
			if err := e.c.CheckLeaseSecret(l.ID, wrong); !errors.Is(err, pool.ErrForbidden) {
				t.Errorf("%s: secret %q: %v", when, wrong, err)
			}
		}
	}
	check("before the restart")
	var raw []byte
	st.View(func(tx store.Tx) error { raw, err = tx.Get(store.Leases, string(l.ID)); return err })
	if err != nil || strings.Contains(string(raw), l.Secret) || !strings.Contains(string(raw), "secret_sha256") {
		t.Fatalf("stored lease %s: %v", raw, err)
	}
	if lv, _ := e.c.Lease(l.ID); lv.Secret != "" {
		t.Fatal("the lease view shows the secret")
	}
	if r, _ := e.c.Renew(l.ID, pool.RenewRequest{}); r.Lease.Secret != "" {
		t.Fatal("the renewal shows the secret")
	}
	e.open()
	check("after the restart")
	if err := e.c.CheckLeaseSecret("no-such-lease", ""); err != nil {
		t.Errorf("unknown lease: %v (the route answers 404 itself)", err)
	}
}

// Frees that keep failing are retried every sweep but logged once, then
// once a minute, and their recovery once.
func TestFailedFreeLogRateLimited(t *testing.T) {
	ctx := context.Background()
	core, logs := observer.New(zap.InfoLevel)
	clock := &pooltest.Clock{}
	ss := &pooltest.Servers{}
	c, err := coord.New(coord.Options{Store: store.NewMem(), Dialer: ss, SlabSize: slabSize, Clock: clock,
		HeartbeatTimeout: time.Hour, Seed: 42, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(ss.Add("s0", 4, slabSize, "")); err != nil {
		t.Fatal(err)
	}
	l, _ := c.CreateLease(pool.CreateLeaseRequest{Agent: "a", TTL: pool.Duration(time.Hour)})
	slabs, err := c.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 3, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	ss.Get("s0").Fail(errors.New("unreachable"))
	for _, sl := range slabs {
		if err := c.FreeSlab(ctx, l.ID, sl.ID); err != nil {
			t.Fatal(err)
		}
	}
	for range 150 { // 150 sweeps, one a second
		clock.Advance(time.Second)
		c.Tick(ctx)
		c.WaitFrees()
	}
	failed := logs.FilterMessageSnippet("fail").Len()
	if calls := ss.Get("s0").Calls(); calls < 150 {
		t.Fatalf("only %d calls: the frees were not retried every sweep", calls)
	}
	// The first failure, and one line per minute after (at 60s and 120s).
	if failed != 3 {
		for _, e := range logs.All() {
			t.Log(e.Message, e.ContextMap())
		}
		t.Fatalf("%d log lines about failing frees over 150 sweeps of 3 slabs, want 3", failed)
	}
	ss.Get("s0").Fail(nil)
	for range 2 {
		c.Tick(ctx)
		c.WaitFrees()
	}
	if n := logs.FilterMessage("frees succeed again").Len(); n != 1 {
		t.Fatalf("%d lines about the recovery, want 1", n)
	}
	if sv, _ := c.Server("s0"); sv.FreeSlabs != 4 {
		t.Fatalf("%d free slabs after the recovery", sv.FreeSlabs)
	}
}
