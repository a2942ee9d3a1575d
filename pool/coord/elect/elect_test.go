package elect

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rmem/pool"
	"rmem/pool/store"
	"rmem/pool/store/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newElector(t *testing.T, st *store.Etcd, id string) *Elector {
	t.Helper()
	e, err := New(Options{Client: st.Client(), Prefix: st.Prefix(), Self: Info{ID: id, URL: "http://" + id + ":1"}, TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func openStore(t *testing.T, srv *etcdtest.Server) *store.Etcd {
	t.Helper()
	st, err := store.OpenEtcd(store.EtcdOptions{Endpoints: []string{srv.Endpoint}, Prefix: "/elect"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestEtcdLeaderHandover: one of two candidates leads, the other
// waits; Members and Leader say so; when the leader resigns the other
// leads at once with a larger epoch, and the old term's fenced writes
// fail.
func TestEtcdLeaderHandover(t *testing.T) {
	srv := etcdtest.Start(t)
	sa, sb := openStore(t, srv), openStore(t, srv)
	a, b := newElector(t, sa, "a"), newElector(t, sb, "b")
	ctx := context.Background()
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.Valid(); err != nil {
		t.Fatal(err)
	}
	got := make(chan *Term, 1)
	go func() {
		tb, err := b.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- tb
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("b leads while a does")
	default:
	}
	ms, err := b.Members(ctx)
	if err != nil || len(ms) != 2 || ms[0].ID != "a" || !ms[0].Leader || ms[1].Leader {
		t.Fatalf("members %+v %v", ms, err)
	}
	if in, _, err := b.Leader(ctx); err != nil || in.ID != "a" {
		t.Fatalf("leader %+v %v", in, err)
	}
	fa := sa.Fenced(ta.Fence())
	if err := fa.Update(func(tx store.Tx) error { return tx.Put(store.Meta, "x", []byte("a")) }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ta.Resign(ctx)
	var tb *Term
	select {
	case tb = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not lead after a resigned")
	}
	defer tb.Resign(ctx)
	t.Logf("handover after a resignation: %v", time.Since(start))
	if !errors.Is(ta.Valid(), pool.ErrNotLeader) {
		t.Errorf("a's term after resigning: %v", ta.Valid())
	}
	if tb.Epoch() <= ta.Epoch() {
		t.Errorf("epochs a %d, b %d: want b's larger", ta.Epoch(), tb.Epoch())
	}
	if err := fa.Update(func(tx store.Tx) error { return tx.Put(store.Meta, "x", []byte("stale")) }); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a write of the ended term: %v, want ErrFenced", err)
	}
	if err := sb.Fenced(tb.Fence()).Update(func(tx store.Tx) error { return tx.Put(store.Meta, "x", []byte("b")) }); err != nil {
		t.Errorf("the new leader's write: %v", err)
	}
}

// TestEtcdLeaderLeaseLostEndsTerm: when the term's etcd lease goes (revoked
// from outside, as when it expires), the term ends within a keep-alive
// interval and is invalid from then on.
func TestEtcdLeaderLeaseLostEndsTerm(t *testing.T) {
	srv := etcdtest.Start(t)
	st := openStore(t, srv)
	e := newElector(t, st, "a")
	term, err := e.Campaign(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())
	if _, err := st.Client().Revoke(context.Background(), term.lease); err != nil {
		t.Fatal(err)
	}
	select {
	case <-term.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the term did not end after its lease was revoked")
	}
	if err := term.Valid(); !errors.Is(err, pool.ErrNotLeader) {
		t.Fatalf("valid after the lease is gone: %v", err)
	}
	if err := st.Fenced(term.Fence()).Update(func(tx store.Tx) error { return tx.Put(store.Meta, "x", nil) }); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("fenced write after the term: %v", err)
	}
}

// TestEtcdLeaderInvalidWithoutEtcd: with etcd gone (killed), the term
// stops being valid before its lease can have expired on etcd: at most
// TTL after the last answered keep-alive.
func TestEtcdLeaderInvalidWithoutEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	st := openStore(t, srv)
	e := newElector(t, st, "a")
	term, err := e.Campaign(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())
	time.Sleep(700 * time.Millisecond) // a keep-alive or two
	bound := term.ValidUntil()
	srv.Kill()
	for term.Valid() == nil {
		if time.Now().After(bound) {
			t.Fatalf("valid past %v, when the lease may have expired", bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("invalid %v before the lease's earliest expiry", time.Until(bound).Round(time.Millisecond))
	select {
	case <-term.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the term did not end")
	}
}

func TestDecodeInfo(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{`{"id":"c1","url":"http://10.0.0.1:7470"}`, true},
		{`{"id":"","url":"http://x:1"}`, false},
		{`{"id":"c1","url":"ftp://x"}`, false},
		{`{"id":"c1"}`, false},
		{`not json`, false},
	} {
		_, err := DecodeInfo([]byte(c.in))
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInfo)) {
			t.Errorf("%s: %v", c.in, err)
		}
	}
}

// FuzzDecodeInfo: election values come from etcd (outside bytes):
// anything decodes to a valid Info or fails with ErrInfo.
func FuzzDecodeInfo(f *testing.F) {
	f.Add([]byte(`{"id":"c1","url":"http://10.0.0.1:7470"}`))
	f.Add([]byte(`{"id":"c1","url":"https://[::1]:1"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := DecodeInfo(b)
		if err != nil {
			if !errors.Is(err, ErrInfo) {
				t.Fatalf("error without ErrInfo: %v", err)
			}
			return
		}
		if in.Validate() != nil {
			t.Fatalf("accepted an invalid %+v", in)
		}
	})
}
