package rdma_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"rmem/rdma"
	"rmem/rdma/rdmatest"
	_ "rmem/rdma/shm"
	_ "rmem/rdma/tcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeyText(t *testing.T) {
	k, err := rdma.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := rdma.NewKey()
	if k.IsZero() || k == k2 {
		t.Fatal("keys are not random")
	}
	p, err := rdma.ParseKey(k.String())
	if err != nil || p != k || len(k.String()) != 32 {
		t.Fatalf("round trip of %s: %s %v", k, p, err)
	}
	type lease struct {
		Key rdma.Key `json:"key"`
	}
	b, err := json.Marshal(lease{k})
	if err != nil || !strings.Contains(string(b), `"`+k.String()+`"`) {
		t.Fatalf("json: %s %v", b, err)
	}
	var l lease
	if err := json.Unmarshal(b, &l); err != nil || l.Key != k {
		t.Fatalf("json back: %v %v", l.Key, err)
	}
	for _, bad := range []string{"", "00", strings.Repeat("0", 31), strings.Repeat("0", 33), strings.Repeat("g", 32)} {
		if _, err := rdma.ParseKey(bad); !errors.Is(err, rdma.ErrBadKey) {
			t.Errorf("ParseKey(%q): %v", bad, err)
		}
	}
	if err := json.Unmarshal([]byte(`{"key":"zz"}`), &l); !errors.Is(err, rdma.ErrBadKey) {
		t.Errorf("json with bad key: %v", err)
	}
}

func TestAccessAndStatus(t *testing.T) {
	cases := []struct {
		a              rdma.Access
		r, w, cas, add bool
	}{
		{rdma.AccessRead, true, false, false, false},
		{rdma.AccessWrite, false, true, false, false},
		{rdma.AccessReadWrite, true, true, true, true},
	}
	for _, c := range cases {
		got := [4]bool{c.a.Allows(rdma.OpRead), c.a.Allows(rdma.OpWrite), c.a.Allows(rdma.OpCompareSwap), c.a.Allows(rdma.OpFetchAdd)}
		if got != [4]bool{c.r, c.w, c.cas, c.add} {
			t.Errorf("%s allows %v", c.a, got)
		}
	}
	if rdma.Access(0).Valid() || rdma.Access(4).Valid() || rdma.Access(0).Allows(rdma.OpRead) {
		t.Error("empty or unknown access accepted")
	}
	if rdma.StatusOK.Err() != nil || !errors.Is(rdma.StatusRevokedKey.Err(), rdma.ErrRevokedKey) ||
		!errors.Is(rdma.Status(200).Err(), rdma.ErrInvalidRequest) {
		t.Error("Status.Err mapping")
	}
	if n := testing.AllocsPerRun(100, func() { _ = rdma.StatusOutOfBounds.Err() }); n != 0 {
		t.Errorf("Status.Err allocates %v", n)
	}
}

func TestAllocRegion(t *testing.T) {
	for _, size := range []int64{0, -4096, 100, 4097} {
		if _, err := rdma.AllocRegion(size, rdma.RegionOptions{}); err == nil {
			t.Errorf("AllocRegion(%d) succeeded", size)
		}
	}
	r, err := rdma.AllocRegion(1<<20, rdma.RegionOptions{Name: "test", THP: true, Lock: true})
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOMEM) {
		t.Skipf("mlock not permitted here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Len() != 1<<20 || r.Fd() < 0 || len(r.Bytes()) != 1<<20 {
		t.Fatalf("region: len %d fd %d", r.Len(), r.Fd())
	}
	r.Bytes()[12345] = 7 // writable
	d := rdma.NewDomain(rdma.DomainOptions{})
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	if err := d.Register(r); !errors.Is(err, rdma.ErrRegistered) {
		t.Fatalf("double register: %v", err)
	}
	if err := r.Close(); !errors.Is(err, rdma.ErrRegistered) {
		t.Fatalf("close while registered: %v", err)
	}
	if err := d.Deregister(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if err := d.Deregister(context.Background(), r); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Fatalf("double deregister: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := d.Register(r); err == nil {
		t.Fatal("registered a closed region")
	}
}

func TestAllocRegionHugeTLB(t *testing.T) {
	r, err := rdma.AllocRegion(2<<20, rdma.RegionOptions{HugeTLB: true})
	if err != nil {
		t.Skipf("no hugetlb pages here: %v", err)
	}
	defer r.Close()
	r.Bytes()[0] = 1
	if _, err := rdma.AllocRegion(4096, rdma.RegionOptions{HugeTLB: true}); err == nil {
		t.Fatal("hugetlb region of 4 KiB accepted")
	}
}

func newDomain(t *testing.T, opts rdma.DomainOptions) (*rdma.Domain, *rdma.Region) {
	d := rdma.NewDomain(opts)
	r := rdma.NewRegion(make([]byte, 1<<20))
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	return d, r
}

func TestIssueKey(t *testing.T) {
	d, r := newDomain(t, rdma.DomainOptions{})
	for _, c := range []struct {
		off, n uint64
		acc    rdma.Access
	}{
		{0, 0, rdma.AccessRead}, {1 << 20, 1, rdma.AccessRead}, {1, 1 << 20, rdma.AccessRead},
		{^uint64(0), 2, rdma.AccessRead}, {0, 1, 0}, {0, 1, 8},
	} {
		if _, err := d.IssueKey(r, c.off, c.n, c.acc); err == nil {
			t.Errorf("IssueKey(%d, %d, %d) succeeded", c.off, c.n, c.acc)
		}
	}
	other := rdma.NewRegion(make([]byte, 4096))
	if _, err := d.IssueKey(other, 0, 4096, rdma.AccessRead); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Errorf("key for unregistered region: %v", err)
	}
	if _, err := d.IssueKey(r, 1<<20-1, 1, rdma.AccessRead); err != nil {
		t.Error(err)
	}
}

// TestRevokeWaitsForInflight: Revoke must not return while an op holds the
// key (the memory server zeroes the slab right after).
func TestRevokeWaitsForInflight(t *testing.T) {
	d, r := newDomain(t, rdma.DomainOptions{RevokeGrace: time.Hour})
	k, _ := d.IssueKey(r, 0, 4096, rdma.AccessReadWrite)
	s := d.NewSession(rdma.SessionHooks{})
	defer s.Close()
	h, st := s.Begin(k, rdma.OpWrite, 0, 4096)
	if st != rdma.StatusOK {
		t.Fatal(st)
	}
	done := make(chan error)
	go func() { done <- d.Revoke(context.Background(), k) }()
	// New ops fail once the revocation has started.
	for {
		h2, st := s.Begin(k, rdma.OpRead, 0, 8)
		if st == rdma.StatusRevokedKey {
			break
		}
		if st != rdma.StatusOK {
			t.Fatal(st)
		}
		s.End(h2) // Revoke had not started yet
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Revoke returned (%v) while an op was in flight", err)
	default:
	}
	s.End(h)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, st := s.Begin(k, rdma.OpRead, 0, 8); st != rdma.StatusRevokedKey {
		t.Fatalf("after revoke: %s", st)
	}
}

// TestRevokeAbortsStalledHolders: after the grace period the Domain aborts
// the connection holding the op; its unwinding ends the hold.
func TestRevokeAbortsStalledHolders(t *testing.T) {
	d, r := newDomain(t, rdma.DomainOptions{RevokeGrace: 10 * time.Millisecond})
	k, _ := d.IssueKey(r, 0, 4096, rdma.AccessReadWrite)
	var s *rdma.Session
	var h rdma.Hold
	aborts := 0
	s = d.NewSession(rdma.SessionHooks{Abort: func() { aborts++; s.End(h) }})
	defer s.Close()
	bystander := d.NewSession(rdma.SessionHooks{Abort: func() { t.Error("aborted a session that held nothing") }})
	defer bystander.Close()
	var st rdma.Status
	if h, st = s.Begin(k, rdma.OpRead, 0, 4096); st != rdma.StatusOK {
		t.Fatal(st)
	}
	if err := d.Revoke(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	if aborts != 1 {
		t.Fatalf("%d aborts", aborts)
	}
}

func TestRevokeIncompleteThenRetry(t *testing.T) {
	d, r := newDomain(t, rdma.DomainOptions{RevokeGrace: time.Millisecond})
	k, _ := d.IssueKey(r, 0, 4096, rdma.AccessReadWrite)
	s := d.NewSession(rdma.SessionHooks{Abort: func() {}}) // cannot unwind
	defer s.Close()
	h, _ := s.Begin(k, rdma.OpRead, 0, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := d.Revoke(ctx, k); !errors.Is(err, rdma.ErrRevokeIncomplete) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("revoke with a stuck op: %v", err)
	}
	if err := d.Revoke(ctx, k); !errors.Is(err, rdma.ErrRevokeIncomplete) {
		t.Fatalf("second revoke still stuck: %v", err)
	}
	s.End(h)
	if err := d.Revoke(context.Background(), k); err != nil {
		t.Fatalf("revoke after the op ended: %v", err)
	}
	if err := d.Revoke(context.Background(), k); err != nil {
		t.Fatalf("revoke of a revoked key: %v", err)
	}
}

func TestRevokeFencesMappers(t *testing.T) {
	d := rdma.NewDomain(rdma.DomainOptions{})
	r, err := rdma.AllocRegion(1<<20, rdma.RegionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	k, _ := d.IssueKey(r, 4096, 8192, rdma.AccessRead)
	fails := 1
	var fenced []rdma.Key
	s := d.NewSession(rdma.SessionHooks{Fence: func(ctx context.Context, fk rdma.Key) error {
		fenced = append(fenced, fk)
		if fails > 0 {
			fails--
			return errors.New("client busy")
		}
		return nil
	}})
	defer s.Close()
	m, st := s.Map(k)
	if st != rdma.StatusOK || m.Fd != r.Fd() || m.Offset != 4096 || m.Len != 8192 || m.Access != rdma.AccessRead {
		t.Fatalf("map: %+v %s", m, st)
	}
	if err := d.Revoke(context.Background(), k); !errors.Is(err, rdma.ErrRevokeIncomplete) {
		t.Fatalf("revoke with a failing fence: %v", err)
	}
	if err := d.Revoke(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	if len(fenced) != 2 || fenced[0] != k {
		t.Fatalf("fenced %v", fenced)
	}
	if _, st := s.Map(k); st != rdma.StatusRevokedKey {
		t.Fatalf("map after revoke: %s", st)
	}
	// A region without a memfd cannot be mapped.
	heap := rdma.NewRegion(make([]byte, 4096))
	d.Register(heap)
	hk, _ := d.IssueKey(heap, 0, 4096, rdma.AccessRead)
	if _, st := s.Map(hk); st != rdma.StatusPermission {
		t.Fatalf("map of heap region: %s", st)
	}
	d.Deregister(context.Background(), heap)
	d.Deregister(context.Background(), r)
}

func TestRememberRevokedIsBounded(t *testing.T) {
	d, r := newDomain(t, rdma.DomainOptions{RememberRevoked: 2})
	s := d.NewSession(rdma.SessionHooks{})
	defer s.Close()
	var ks []rdma.Key
	for range 3 {
		k, _ := d.IssueKey(r, 0, 4096, rdma.AccessRead)
		ks = append(ks, k)
		if err := d.Revoke(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	want := []rdma.Status{rdma.StatusUnknownKey, rdma.StatusRevokedKey, rdma.StatusRevokedKey}
	for i, k := range ks {
		if _, st := s.Begin(k, rdma.OpRead, 0, 8); st != want[i] {
			t.Errorf("key %d: %s, want %s", i, st, want[i])
		}
	}
}

func TestSessionChecksAndStats(t *testing.T) {
	d, r := newDomain(t, rdma.DomainOptions{})
	k, _ := d.IssueKey(r, 8, 64, rdma.AccessReadWrite)
	s := d.NewSession(rdma.SessionHooks{})
	defer s.Close()
	cases := []struct {
		op  rdma.Opcode
		off uint64
		n   int
		st  rdma.Status
	}{
		{rdma.OpRead, 0, 64, rdma.StatusOK},
		{rdma.OpWrite, 63, 1, rdma.StatusOK},
		{rdma.OpWrite, 64, 0, rdma.StatusOK},
		{rdma.OpRead, 1, 64, rdma.StatusOutOfBounds},
		{rdma.OpRead, ^uint64(0), 2, rdma.StatusOutOfBounds},
		{rdma.OpFetchAdd, 0, 8, rdma.StatusOK}, // region offset 8: aligned
		{rdma.OpFetchAdd, 4, 8, rdma.StatusMisaligned},
		{rdma.OpFetchAdd, 0, 4, rdma.StatusInvalid},
		{rdma.OpRead, 0, rdma.MaxTransfer + 1, rdma.StatusInvalid},
		{0, 0, 8, rdma.StatusInvalid},
	}
	for _, c := range cases {
		h, st := s.Begin(k, c.op, c.off, c.n)
		if st != c.st {
			t.Errorf("%s off %d n %d: %s, want %s", c.op, c.off, c.n, st, c.st)
		}
		if st == rdma.StatusOK {
			if len(h.Mem) != c.n || (c.n > 0 && &h.Mem[0] != &r.Bytes()[8+c.off]) {
				t.Errorf("%s off %d: hold covers the wrong bytes", c.op, c.off)
			}
			s.End(h)
		}
	}
	st := d.Stats()
	if st.Reads != 1 || st.Writes != 2 || st.FetchAdds != 1 || st.BytesRead != 64 || st.BytesWritten != 1 || st.Errors != 6 || st.Keys != 1 {
		t.Fatalf("stats %+v", st)
	}
	if n := testing.AllocsPerRun(100, func() { h, _ := s.Begin(k, rdma.OpRead, 0, 64); s.End(h) }); n != 0 {
		t.Fatalf("Begin/End allocate %v", n)
	}
}

func TestDialByName(t *testing.T) {
	got := strings.Join(rdma.Providers(), ",")
	for _, want := range []string{"mem", "shm", "tcp"} {
		if !strings.Contains(got, want) {
			t.Errorf("providers %s lack %s", got, want)
		}
	}
	if _, err := rdma.Dial(context.Background(), "carrier-pigeon", "x", rdma.DialOptions{}); !errors.Is(err, rdma.ErrUnknownProvider) {
		t.Fatalf("unknown provider: %v", err)
	}
	if _, err := rdma.Dial(context.Background(), "tcp", "x", rdma.DialOptions{Depth: -1}); err == nil {
		t.Fatal("negative depth accepted")
	}
	srv := rdmatest.NewServer(t, 1<<20)
	k := srv.Key(t, 0, 4096, rdma.AccessReadWrite)
	conns, err := rdma.DialN(context.Background(), rdmatest.Network, srv.Listener.Addr(), 3, rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range conns {
		if err := rdma.Write(context.Background(), c, k, uint64(i*8), []byte("conn    ")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if _, err := rdma.DialN(context.Background(), "tcp", "127.0.0.1:1", 2, rdma.DialOptions{}); !errors.Is(err, rdma.ErrTransport) {
		t.Fatalf("DialN to a closed port: %v", err)
	}
}

// A domain that never issued a key (a fresh or restarted memory server)
// answers keyed ops with StatusUnknownKey: one such request once crashed
// memd (a nil key snapshot).
func TestUnknownKeyBeforeAnyIssued(t *testing.T) {
	d := rdma.NewDomain(rdma.DomainOptions{})
	s := d.NewSession(rdma.SessionHooks{})
	defer s.Close()
	k, err := rdma.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []rdma.Opcode{rdma.OpRead, rdma.OpWrite, rdma.OpCompareSwap, rdma.OpFetchAdd} {
		n := 4096
		if op == rdma.OpCompareSwap || op == rdma.OpFetchAdd {
			n = rdma.AtomicSize
		}
		if _, st := s.Begin(k, op, 0, n); st != rdma.StatusUnknownKey {
			t.Errorf("%s with a key never issued: %s, want %s", op, st, rdma.StatusUnknownKey)
		}
	}
}
