//go:build verbs

package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rmem/pool"
	"rmem/pool/memserver"
	"rmem/rdma"
	"rmem/rdma/rdmatest"
	"rmem/rdma/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testIP returns the address an RDMA device serves, or skips: the host
// kernel of the build machines has no RDMA stack; tests/rdma-vm/run.sh runs
// these tests in a guest with rxe0 on 10.0.2.15.
func testIP(t testing.TB) string {
	t.Helper()
	devs, err := verbs.Devices()
	if err != nil {
		t.Skipf("%v (run tests/rdma-vm/run.sh for Soft-RoCE in a VM)", err)
	}
	ip := os.Getenv("RMEM_VERBS_TEST_ADDR")
	if ip == "" {
		t.Skipf("devices %v, but RMEM_VERBS_TEST_ADDR (an IP address one of them serves) is not set", devs)
	}
	return ip
}

func newEnv(t *testing.T) *rdmatest.Env {
	ip := testIP(t)
	region, err := rdma.AllocRegion(rdmatest.ConformanceRegionSize, rdma.RegionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := rdma.NewDomain(rdma.DomainOptions{})
	if err := d.Register(region); err != nil {
		t.Fatal(err)
	}
	l, err := rdma.Listen("verbs", net.JoinHostPort(ip, "0"), d, rdma.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := &rdmatest.Env{Network: "verbs", Addr: l.Addr(), Domain: d, Region: region}
	e.Kill = func() { l.Close() }
	e.Restart = func() {
		var err error
		if l, err = rdma.Listen("verbs", e.Addr, d, rdma.ListenOptions{}); err != nil {
			t.Fatalf("restart: %v", err)
		}
	}
	t.Cleanup(func() {
		l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Deregister(ctx, region); err != nil {
			t.Error(err)
		}
		region.Close()
	})
	return e
}

func TestConformance(t *testing.T) {
	testIP(t) // skip once, not per subtest
	rdmatest.RunConformance(t, newEnv)
}

// TestMemserver is the end-to-end check: a real memd memory server
// (pool/memserver) serving its slabs over verbs, and a client that writes
// and reads pages with the keys it grants; freeing a slab revokes the key
// (the client's next op fails) and zeroes it.
func TestMemserver(t *testing.T) {
	ip := testIP(t)
	const slab = 2 << 20
	srv, err := memserver.New(memserver.Options{
		ID: "vm-1", Capacity: 4 * slab, SlabSize: slab,
		Listen: map[string]string{"verbs": net.JoinHostPort(ip, "0")},
		NoLock: true, NoHugeTLB: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys, err := srv.Grant(ctx, srv.Instance(), 0, []pool.SlabIndex{1, 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := rdma.Dial(ctx, "verbs", srv.Info().Addrs["verbs"], rdma.DialOptions{Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k1, _ := rdma.ParseKey(string(keys[0]))
	k3, _ := rdma.ParseKey(string(keys[1]))
	const pages = 64
	out := make([]byte, pages*4096)
	for i := range out {
		out[i] = byte(i*7 + i>>12)
	}
	wrs := make([]rdma.WorkRequest, 0, 2*pages)
	for p := range pages {
		wrs = append(wrs, rdma.WorkRequest{ID: uint64(p), Op: rdma.OpWrite, Key: k1, Offset: uint64(p) * 4096 * 7 % slab,
			Local: out[p*4096 : (p+1)*4096]})
	}
	for p := range pages {
		wrs = append(wrs, rdma.WorkRequest{ID: uint64(pages + p), Op: rdma.OpWrite, Key: k3, Offset: uint64(p) * 4096,
			Local: out[p*4096 : (p+1)*4096]})
	}
	waitBatch(t, c, wrs[:pages])
	waitBatch(t, c, wrs[pages:])
	in := make([]byte, len(out))
	for i := range wrs {
		wrs[i].Op = rdma.OpRead
		wrs[i].Local = in[i%pages*4096 : (i%pages+1)*4096]
		if i == pages {
			waitBatch(t, c, wrs[:pages])
			if !bytes.Equal(in, out) {
				t.Fatal("pages read back from slab 1 differ")
			}
			clear(in)
		}
	}
	waitBatch(t, c, wrs[pages:])
	if !bytes.Equal(in, out) {
		t.Fatal("pages read back from slab 3 differ")
	}
	// Free slab 1: its key is revoked, the slab zeroed; slab 3 still works.
	if err := srv.Free(ctx, srv.Instance(), []pool.FreeEntry{{Index: 1, Key: keys[0]}}); err != nil {
		t.Fatal(err)
	}
	if err := rdma.Read(ctx, c, k1, 0, in[:4096]); !errors.Is(err, rdma.ErrRevokedKey) {
		t.Fatalf("read with the freed slab's key: %v, want ErrRevokedKey", err)
	}
	if err := rdma.Read(ctx, c, k3, 4096, in[:4096]); err != nil || !bytes.Equal(in[:4096], out[4096:8192]) {
		t.Fatalf("read of slab 3 after freeing slab 1: %v", err)
	}
	again, err := srv.Grant(ctx, srv.Instance(), 0, []pool.SlabIndex{1})
	if err != nil {
		t.Fatal(err)
	}
	k1b, _ := rdma.ParseKey(string(again[0]))
	if err := rdma.Read(ctx, c, k1b, 0, in[:4096]); err != nil || !bytes.Equal(in[:4096], make([]byte, 4096)) {
		t.Fatalf("slab 1 granted again is not zero: %v", err)
	}
	if st := srv.Domain().Stats(); st.Keys != 2 {
		t.Fatalf("live keys %d, want 2", st.Keys)
	}
}

func waitBatch(t *testing.T, c rdma.Conn, wrs []rdma.WorkRequest) {
	t.Helper()
	if err := c.Post(wrs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cq := make([]rdma.Completion, 16)
	for got := 0; got < len(wrs); {
		n, err := c.Wait(ctx, cq)
		if err != nil {
			t.Fatal(err)
		}
		for _, ce := range cq[:n] {
			if ce.Status != rdma.StatusOK || ce.ID != wrs[got].ID {
				t.Fatalf("completion %d: %+v", got, ce)
			}
			got++
		}
	}
}

// TestNoDevice: without a device (the build host) Dial and Listen say so
// in one line.
func TestNoDevice(t *testing.T) {
	if _, err := verbs.Devices(); err == nil {
		t.Skip("this machine has RDMA devices")
	}
	d := rdma.NewDomain(rdma.DomainOptions{})
	_, err := rdma.Listen("verbs", "127.0.0.1:0", d, rdma.ListenOptions{})
	if !errors.Is(err, verbs.ErrNoDevice) || bytes.ContainsRune([]byte(err.Error()), '\n') {
		t.Fatalf("listen without a device: %v", err)
	}
	t.Log(err)
}

// TestRevokedKeyMidBatch drives the recovery path: the client still holds
// the rkey of a revoked key, so the device fails that request with a remote
// access error, which breaks both QPs and flushes the requests behind it.
// The revoked request must complete with StatusRevokedKey, every other one
// must execute exactly once and in order, and the connection must stay
// usable.
func TestRevokedKeyMidBatch(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := rdma.Dial(ctx, "verbs", e.Addr, rdma.DialOptions{Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	doomed, err := e.Domain.IssueKey(e.Region, 0, 4096, rdma.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	live, err := e.Domain.IssueKey(e.Region, 1<<20, 1<<20, rdma.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	// Both keys resolved: the client caches their rkeys.
	if _, err := rdma.FetchAdd(ctx, c, doomed, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := rdma.FetchAdd(ctx, c, live, 0, 0); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		if round > 0 {
			if doomed, err = e.Domain.IssueKey(e.Region, 0, 4096, rdma.AccessReadWrite); err != nil {
				t.Fatal(err)
			}
			if _, err := rdma.FetchAdd(ctx, c, doomed, 0, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Domain.Revoke(ctx, doomed); err != nil {
			t.Fatal(err)
		}
		// FETCH_ADDs on live (word 8), the revoked key in the middle, then
		// more: the counter proves each ran exactly once.
		const n = 40
		wrs := make([]rdma.WorkRequest, n)
		for i := range wrs {
			wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpFetchAdd, Key: live, Offset: 8, Add: 1}
		}
		bad := 10 + round*7
		wrs[bad] = rdma.WorkRequest{ID: uint64(bad), Op: rdma.OpWrite, Key: doomed, Local: []byte("late write")}
		if err := c.Post(wrs); err != nil {
			t.Fatal(err)
		}
		cq := make([]rdma.Completion, 8)
		next := uint64(round * (n - 1))
		for got := 0; got < n; {
			k, err := c.Wait(ctx, cq)
			if err != nil {
				t.Fatalf("round %d: wait after %d: %v", round, got, err)
			}
			for _, ce := range cq[:k] {
				switch {
				case ce.ID != uint64(got):
					t.Fatalf("round %d: completion %d has id %d", round, got, ce.ID)
				case got == bad && ce.Status != rdma.StatusRevokedKey:
					t.Fatalf("round %d: request with the revoked key: %+v", round, ce)
				case got != bad && (ce.Status != rdma.StatusOK || ce.Value != next):
					t.Fatalf("round %d: fetch-add %d: %+v, want old value %d", round, got, ce, next)
				}
				if got != bad {
					next++
				}
				got++
			}
		}
		if string(e.Region.Bytes()[:10]) == "late write" {
			t.Fatalf("round %d: a write with the revoked key landed", round)
		}
	}
}

// TestSharedConn: several goroutines Post and Wait on one Conn (allowed,
// though completions go to whichever caller polls), then Close races with
// a Wait.
func TestSharedConn(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := rdma.Dial(ctx, "verbs", e.Addr, rdma.DialOptions{Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	k, err := e.Domain.IssueKey(e.Region, 0, 1<<20, rdma.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	const workers, per = 4, 50
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			buf := make([]byte, 4096)
			cq := make([]rdma.Completion, 4)
			for i := range per {
				wr := []rdma.WorkRequest{{ID: uint64(w*per + i), Op: rdma.OpWrite, Key: k, Offset: uint64(w) * 4096, Local: buf}}
				for {
					err := c.Post(wr)
					if err == nil {
						break
					}
					if !errors.Is(err, rdma.ErrQueueFull) {
						errs <- err
						return
					}
					time.Sleep(time.Millisecond)
				}
				n, err := c.Wait(ctx, cq)
				if err != nil && !errors.Is(err, rdma.ErrIdle) {
					errs <- err
					return
				}
				for _, ce := range cq[:n] {
					if ce.Status != rdma.StatusOK {
						errs <- ce.Err()
						return
					}
				}
				total.Add(int64(n))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	cq := make([]rdma.Completion, 32)
	for total.Load() < workers*per {
		n, err := c.Wait(ctx, cq)
		if err != nil {
			t.Fatalf("after %d completions: %v", total.Load(), err)
		}
		total.Add(int64(n))
	}
	// Close while another goroutine is in Wait (with the mutex released,
	// asleep in poll(2) on the channel): Wait returns, the race detector
	// sees no conflict with the teardown.
	if err := c.Post([]rdma.WorkRequest{{Op: rdma.OpRead, Key: k, Local: make([]byte, 8)}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			n, err := c.Wait(ctx, cq)
			if err != nil || n == 0 {
				done <- err
				return
			}
		}
	}()
	time.Sleep(10 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, rdma.ErrClosed) && !errors.Is(err, rdma.ErrIdle) {
			t.Fatalf("Wait across Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
}

// TestListenWrongAddress: listening on an address no RDMA device serves
// fails at once, naming the address.
func TestListenWrongAddress(t *testing.T) {
	testIP(t)
	d := rdma.NewDomain(rdma.DomainOptions{})
	_, err := rdma.Listen("verbs", "127.0.0.1:0", d, rdma.ListenOptions{})
	if !errors.Is(err, verbs.ErrNoDevice) || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("listen on loopback: %v", err)
	}
	t.Log(err)
}
