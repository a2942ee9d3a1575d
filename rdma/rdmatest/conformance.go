package rdmatest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"rmem/rdma"
)

// Env is one provider's test fixture for RunConformance.
type Env struct {
	Network string // provider name for rdma.Dial
	Addr    string // where the server listens
	Domain  *rdma.Domain
	// Region is registered in Domain, at least ConformanceRegionSize bytes,
	// zeroed, and 8-byte aligned.
	Region *rdma.Region
	// Kill makes the server fail every connection it serves (a transport
	// failure seen by clients) and stop listening.
	Kill func()
	// Restart serves Domain at Addr again after Kill.
	Restart func()
	// Options are the DialOptions the provider wants (e.g. TLS); Depth is
	// set by the tests.
	Options rdma.DialOptions
	// AllocsReason, when set, skips the zero-allocation test and says why
	// (e.g. crypto/tls allocates per record read).
	AllocsReason string
}

// ConformanceRegionSize is the smallest Region RunConformance accepts.
const ConformanceRegionSize = 4 << 20

// hangGuard bounds waits that must finish; exceeding it is a hang, not a
// slow machine.
const hangGuard = 30 * time.Second

// RunConformance runs the provider-independent tests. newEnv is called once
// per subtest and must clean up with t.Cleanup.
func RunConformance(t *testing.T, newEnv func(t *testing.T) *Env) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *Env)
	}{
		{"ReadWrite", testReadWrite},
		{"KeyRangeIsRelative", testKeyRange},
		{"Batch", testBatch},
		{"Ordering", testOrdering},
		{"PipelinedErrors", testPipelinedErrors},
		{"Atomics", testAtomics},
		{"AtomicsConcurrent", testAtomicsConcurrent},
		{"Bounds", testBounds},
		{"Keys", testKeys},
		{"Permissions", testPermissions},
		{"Revoke", testRevoke},
		{"RevokeUnderLoad", testRevokeUnderLoad},
		{"QueueDepth", testQueueDepth},
		{"InvalidRequests", testInvalid},
		{"Idle", testIdle},
		{"Close", testClose},
		{"TransportFailure", testTransportFailure},
		{"ZeroAllocs", testZeroAllocs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if e.Region.Len() < ConformanceRegionSize {
				t.Fatalf("env region is %d bytes, want >= %d", e.Region.Len(), ConformanceRegionSize)
			}
			tc.fn(t, e)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, e *Env, depth int) rdma.Conn {
	t.Helper()
	o := e.Options
	o.Depth = depth
	c, err := rdma.Dial(ctxT(t), e.Network, e.Addr, o)
	if err != nil {
		t.Fatalf("dial %s %s: %v", e.Network, e.Addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func issue(t *testing.T, e *Env, off, n uint64, acc rdma.Access) rdma.Key {
	t.Helper()
	k, err := e.Domain.IssueKey(e.Region, off, n, acc)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// waitAll collects exactly n completions.
func waitAll(t *testing.T, c rdma.Conn, n int) []rdma.Completion {
	t.Helper()
	ctx := ctxT(t)
	out := make([]rdma.Completion, 0, n)
	buf := make([]rdma.Completion, 16)
	for len(out) < n {
		k, err := c.Wait(ctx, buf)
		if err != nil {
			t.Fatalf("wait after %d of %d completions: %v", len(out), n, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

func pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func testReadWrite(t *testing.T, e *Env) {
	ctx := ctxT(t)
	c := dial(t, e, 0)
	k := issue(t, e, 0, 1<<20, rdma.AccessReadWrite)
	for _, n := range []int{1, 7, 4096, 65536, rdma.MaxTransfer} {
		want := pattern(uint64(n), n)
		off := uint64(1<<20 - n)
		if err := rdma.Write(ctx, c, k, off, want); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		if got := e.Region.Bytes()[off : off+uint64(n)]; !bytes.Equal(got, want) {
			t.Fatalf("write %d bytes: region does not hold them", n)
		}
		got := make([]byte, n)
		if err := rdma.Read(ctx, c, k, off, got); err != nil {
			t.Fatalf("read %d: %v", n, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes: data differs", n)
		}
	}
	// The server's own writes are visible to READ.
	copy(e.Region.Bytes()[100:], "server wrote this")
	got := make([]byte, 17)
	if err := rdma.Read(ctx, c, k, 100, got); err != nil || string(got) != "server wrote this" {
		t.Fatalf("read of server write: %q, %v", got, err)
	}
	// A zero-length op is valid and moves nothing.
	if err := rdma.Read(ctx, c, k, 1<<20, nil); err != nil {
		t.Fatalf("zero-length read at end of range: %v", err)
	}
}

func testKeyRange(t *testing.T, e *Env) {
	ctx := ctxT(t)
	c := dial(t, e, 0)
	const base = 3 << 20
	k := issue(t, e, base, 8192, rdma.AccessReadWrite)
	if err := rdma.Write(ctx, c, k, 4096, []byte("slab page 1")); err != nil {
		t.Fatal(err)
	}
	if got := string(e.Region.Bytes()[base+4096 : base+4096+11]); got != "slab page 1" {
		t.Fatalf("offset 4096 of key at %d landed elsewhere: region holds %q", base, got)
	}
}

func testBatch(t *testing.T, e *Env) {
	const depth, page = 64, 4096
	c := dial(t, e, depth)
	k := issue(t, e, 0, depth*page, rdma.AccessReadWrite)
	for i := range depth {
		copy(e.Region.Bytes()[i*page:], pattern(uint64(i), page))
	}
	bufs := make([]byte, depth*page)
	wrs := make([]rdma.WorkRequest, depth)
	for round := range 3 {
		clear(bufs)
		for i := range wrs {
			wrs[i] = rdma.WorkRequest{ID: uint64(1000*round + i), Op: rdma.OpRead, Key: k,
				Offset: uint64(i * page), Local: bufs[i*page : (i+1)*page]}
		}
		// Post in uneven batches, all outstanding at once.
		for lo := 0; lo < depth; {
			hi := min(depth, lo+1+lo%7)
			if err := c.Post(wrs[lo:hi]); err != nil {
				t.Fatalf("post [%d,%d): %v", lo, hi, err)
			}
			lo = hi
		}
		cq := waitAll(t, c, depth)
		for i, ce := range cq {
			if ce.ID != uint64(1000*round+i) || ce.Status != rdma.StatusOK || ce.Op != rdma.OpRead || ce.Len != page {
				t.Fatalf("completion %d = %+v", i, ce)
			}
			if !bytes.Equal(bufs[i*page:(i+1)*page], pattern(uint64(i), page)) {
				t.Fatalf("page %d: wrong data", i)
			}
		}
	}
}

func testOrdering(t *testing.T, e *Env) {
	c := dial(t, e, 128)
	k := issue(t, e, 0, 4096, rdma.AccessReadWrite)
	const n = 40
	vals := make([][]byte, n)
	reads := make([][]byte, n)
	var wrs []rdma.WorkRequest
	for i := range n {
		vals[i] = pattern(uint64(i+100), 512)
		reads[i] = make([]byte, 512)
		wrs = append(wrs,
			rdma.WorkRequest{ID: uint64(3 * i), Op: rdma.OpWrite, Key: k, Offset: 64, Local: vals[i]},
			rdma.WorkRequest{ID: uint64(3*i + 1), Op: rdma.OpRead, Key: k, Offset: 64, Local: reads[i]},
			rdma.WorkRequest{ID: uint64(3*i + 2), Op: rdma.OpFetchAdd, Key: k, Offset: 0, Add: 1},
		)
	}
	for lo := 0; lo < len(wrs); lo += 30 {
		if err := c.Post(wrs[lo:min(lo+30, len(wrs))]); err != nil {
			t.Fatal(err)
		}
		if lo%60 == 30 {
			continue
		}
	}
	cq := waitAll(t, c, len(wrs))
	for i, ce := range cq {
		if ce.ID != uint64(i) || ce.Status != rdma.StatusOK {
			t.Fatalf("completion %d out of order or failed: %+v", i, ce)
		}
		if ce.Op == rdma.OpFetchAdd && ce.Value != uint64(i/3) {
			t.Fatalf("fetch-add %d saw %d, want %d (ops reordered)", i/3, ce.Value, i/3)
		}
	}
	for i := range n {
		if !bytes.Equal(reads[i], vals[i]) {
			t.Fatalf("read %d did not see the write posted just before it", i)
		}
	}
}

// testPipelinedErrors mixes failing and good ops in one batch: the failures
// must not disturb the data of the good ones around them.
func testPipelinedErrors(t *testing.T, e *Env) {
	const n, page = 96, 4096
	c := dial(t, e, n)
	k := issue(t, e, 0, 64*page, rdma.AccessReadWrite)
	for i := range 64 {
		copy(e.Region.Bytes()[i*page:], pattern(uint64(i+500), page))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 20 {
		bufs := make([][]byte, n)
		wrs := make([]rdma.WorkRequest, n)
		want := make([]rdma.Status, n)
		for i := range wrs {
			size := page
			if rng.IntN(3) == 0 {
				size = 1 + rng.IntN(3*page)
			}
			bufs[i] = make([]byte, size)
			p := rng.IntN(64)
			wr := rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: k, Offset: uint64(p * page), Local: bufs[i]}
			switch rng.IntN(5) {
			case 0:
				wr.Offset = 64*page - uint64(size) + 1 // out of bounds
				want[i] = rdma.StatusOutOfBounds
			case 1:
				wr.Key = rdma.Key{byte(round)} // unknown
				want[i] = rdma.StatusUnknownKey
			case 2:
				wr.Op, wr.Local = rdma.OpFetchAdd, nil
				wr.Offset = uint64(p*page) + 1 // misaligned
				want[i] = rdma.StatusMisaligned
			}
			if want[i] == rdma.StatusOK && uint64(size) > 64*page-wr.Offset {
				wr.Offset = 0
			}
			wrs[i] = wr
		}
		if err := c.Post(wrs); err != nil {
			t.Fatal(err)
		}
		cq := waitAll(t, c, n)
		for i, ce := range cq {
			if ce.ID != uint64(i) || ce.Status != want[i] {
				t.Fatalf("round %d: completion %d = %+v, want status %s", round, i, ce, want[i])
			}
			if want[i] == rdma.StatusOK {
				off := wrs[i].Offset
				if !bytes.Equal(bufs[i], e.Region.Bytes()[off:off+uint64(len(bufs[i]))]) {
					t.Fatalf("round %d: READ %d (after failures) has wrong data", round, i)
				}
			}
		}
	}
}

func testAtomics(t *testing.T, e *Env) {
	ctx := ctxT(t)
	c := dial(t, e, 0)
	k := issue(t, e, 4096, 4096, rdma.AccessReadWrite)
	word := e.Region.Bytes()[4096+16 : 4096+24]
	binary.NativeEndian.PutUint64(word, 40)
	old, err := rdma.FetchAdd(ctx, c, k, 16, 2)
	if err != nil || old != 40 || binary.NativeEndian.Uint64(word) != 42 {
		t.Fatalf("fetch-add: old %d err %v, word now %d", old, err, binary.NativeEndian.Uint64(word))
	}
	old, err = rdma.CompareAndSwap(ctx, c, k, 16, 41, 7)
	if err != nil || old != 42 || binary.NativeEndian.Uint64(word) != 42 {
		t.Fatalf("failing CAS: old %d err %v, word now %d", old, err, binary.NativeEndian.Uint64(word))
	}
	old, err = rdma.CompareAndSwap(ctx, c, k, 16, 42, math.MaxUint64)
	if err != nil || old != 42 || binary.NativeEndian.Uint64(word) != math.MaxUint64 {
		t.Fatalf("CAS: old %d err %v, word now %d", old, err, binary.NativeEndian.Uint64(word))
	}
	old, err = rdma.FetchAdd(ctx, c, k, 16, 1) // wraps
	if err != nil || old != math.MaxUint64 || binary.NativeEndian.Uint64(word) != 0 {
		t.Fatalf("wrapping fetch-add: old %d err %v", old, err)
	}
	// The old value also lands in Local when it has room.
	local := make([]byte, 8)
	wrs := []rdma.WorkRequest{{ID: 9, Op: rdma.OpFetchAdd, Key: k, Offset: 16, Add: 5, Local: local}}
	if err := c.Post(wrs); err != nil {
		t.Fatal(err)
	}
	cq := waitAll(t, c, 1)
	if cq[0].Status != rdma.StatusOK || cq[0].Value != 0 || cq[0].Len != 8 || binary.NativeEndian.Uint64(local) != 0 {
		t.Fatalf("fetch-add with Local: %+v local=%x", cq[0], local)
	}
	binary.NativeEndian.PutUint64(local, 99)
	wrs[0] = rdma.WorkRequest{ID: 10, Op: rdma.OpCompareSwap, Key: k, Offset: 16, Compare: 5, Swap: 6, Local: local}
	if err := c.Post(wrs); err != nil {
		t.Fatal(err)
	}
	if cq = waitAll(t, c, 1); cq[0].Value != 5 || binary.NativeEndian.Uint64(local) != 5 {
		t.Fatalf("CAS with Local: %+v local=%d", cq[0], binary.NativeEndian.Uint64(local))
	}
	for _, off := range []uint64{1, 4, 12, 4095} {
		if _, err := rdma.FetchAdd(ctx, c, k, off, 1); !errors.Is(err, rdma.ErrMisaligned) && !errors.Is(err, rdma.ErrOutOfBounds) {
			t.Fatalf("fetch-add at %d: %v, want misaligned", off, err)
		}
	}
	if _, err := rdma.CompareAndSwap(ctx, c, k, 4, 0, 1); !errors.Is(err, rdma.ErrMisaligned) {
		t.Fatalf("CAS at 4: %v, want misaligned", err)
	}
	if _, err := rdma.FetchAdd(ctx, c, k, 4096, 1); !errors.Is(err, rdma.ErrOutOfBounds) {
		t.Fatalf("fetch-add past the end: %v, want out of bounds", err)
	}
	if binary.NativeEndian.Uint64(word) != 6 {
		t.Fatalf("failed atomics changed the word")
	}
}

func testAtomicsConcurrent(t *testing.T, e *Env) {
	k := issue(t, e, 0, 4096, rdma.AccessReadWrite)
	const conns, per = 4, 300
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		c := dial(t, e, 0)
		wg.Go(func() {
			ctx := ctxT(t)
			for range per {
				if _, err := rdma.FetchAdd(ctx, c, k, 8, 1); err != nil {
					errs <- err
					return
				}
				// a CAS-based increment, retried on contention
				for {
					v, err := rdma.FetchAdd(ctx, c, k, 16, 0)
					if err != nil {
						errs <- err
						return
					}
					old, err := rdma.CompareAndSwap(ctx, c, k, 16, v, v+1)
					if err != nil {
						errs <- err
						return
					}
					if old == v {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mem := e.Region.Bytes()
	if a, b := binary.NativeEndian.Uint64(mem[8:]), binary.NativeEndian.Uint64(mem[16:]); a != conns*per || b != conns*per {
		t.Fatalf("fetch-add counter %d, CAS counter %d, want %d", a, b, conns*per)
	}
}

func expectStatus(t *testing.T, c rdma.Conn, wr rdma.WorkRequest, want rdma.Status) {
	t.Helper()
	if err := c.Post([]rdma.WorkRequest{wr}); err != nil {
		t.Fatalf("post %s off %d len %d: %v", wr.Op, wr.Offset, len(wr.Local), err)
	}
	cq := waitAll(t, c, 1)
	if cq[0].Status != want || cq[0].ID != wr.ID {
		t.Fatalf("%s off %d len %d: completion %+v, want status %s", wr.Op, wr.Offset, len(wr.Local), cq[0], want)
	}
	if want != rdma.StatusOK && !errors.Is(cq[0].Err(), want.Err()) {
		t.Fatalf("Err() = %v", cq[0].Err())
	}
}

func testBounds(t *testing.T, e *Env) {
	c := dial(t, e, 0)
	const base, size = 1 << 20, 64 << 10
	k := issue(t, e, base, size, rdma.AccessReadWrite)
	canary := func() []byte {
		return append([]byte(nil), e.Region.Bytes()[base-4096:base+size+4096]...)
	}
	for i := range e.Region.Bytes()[base-4096 : base+size+4096] {
		e.Region.Bytes()[base-4096+i] = 0xA5
	}
	before := canary()
	buf := make([]byte, 8192)
	for i := range buf {
		buf[i] = 0x5A
	}
	cases := []struct {
		off uint64
		n   int
	}{
		{size, 1}, {size - 4095, 4096}, {size + 4096, 8}, {math.MaxUint64, 1},
		{math.MaxUint64 - 10, 4096}, {1 << 63, 4096}, {size - 1, 8192},
	}
	for i, tc := range cases {
		for _, op := range []rdma.Opcode{rdma.OpRead, rdma.OpWrite} {
			expectStatus(t, c, rdma.WorkRequest{ID: uint64(i), Op: op, Key: k, Offset: tc.off, Local: buf[:tc.n]}, rdma.StatusOutOfBounds)
		}
		if tc.off >= size {
			expectStatus(t, c, rdma.WorkRequest{ID: uint64(i), Op: rdma.OpFetchAdd, Key: k, Offset: tc.off &^ 7, Add: 1}, rdma.StatusOutOfBounds)
		}
	}
	if !bytes.Equal(canary(), before) {
		t.Fatal("an out-of-bounds op changed region memory")
	}
	// The connection is still usable, and the exact edges work.
	expectStatus(t, c, rdma.WorkRequest{ID: 77, Op: rdma.OpWrite, Key: k, Offset: size - 4096, Local: buf[:4096]}, rdma.StatusOK)
	expectStatus(t, c, rdma.WorkRequest{ID: 78, Op: rdma.OpRead, Key: k, Offset: 0, Local: buf[:4096]}, rdma.StatusOK)
	mem := e.Region.Bytes()
	if mem[base-1] != 0xA5 || mem[base+size] != 0xA5 || mem[base+size-1] != 0x5A {
		t.Fatal("edge write landed in the wrong place")
	}
}

func testKeys(t *testing.T, e *Env) {
	c := dial(t, e, 0)
	good := issue(t, e, 0, 4096, rdma.AccessReadWrite)
	var unknown rdma.Key
	copy(unknown[:], "not a real key!!")
	flipped := good
	flipped[15] ^= 1
	buf := make([]byte, 64)
	for _, k := range []rdma.Key{unknown, flipped, {}} {
		expectStatus(t, c, rdma.WorkRequest{ID: 1, Op: rdma.OpRead, Key: k, Local: buf}, rdma.StatusUnknownKey)
		expectStatus(t, c, rdma.WorkRequest{ID: 2, Op: rdma.OpWrite, Key: k, Local: buf}, rdma.StatusUnknownKey)
		expectStatus(t, c, rdma.WorkRequest{ID: 3, Op: rdma.OpCompareSwap, Key: k}, rdma.StatusUnknownKey)
	}
	expectStatus(t, c, rdma.WorkRequest{ID: 4, Op: rdma.OpRead, Key: good, Local: buf}, rdma.StatusOK)
}

func testPermissions(t *testing.T, e *Env) {
	c := dial(t, e, 0)
	ro := issue(t, e, 0, 4096, rdma.AccessRead)
	wo := issue(t, e, 0, 4096, rdma.AccessWrite)
	copy(e.Region.Bytes(), "original")
	buf := []byte("tampered")
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpWrite, Key: ro, Local: buf}, rdma.StatusPermission)
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpFetchAdd, Key: ro, Add: 1}, rdma.StatusPermission)
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpCompareSwap, Key: wo}, rdma.StatusPermission)
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpRead, Key: wo, Local: buf}, rdma.StatusPermission)
	if string(buf) != "tampered" || string(e.Region.Bytes()[:8]) != "original" {
		t.Fatal("a refused op moved data")
	}
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpRead, Key: ro, Local: buf}, rdma.StatusOK)
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpWrite, Key: wo, Offset: 8, Local: buf}, rdma.StatusOK)
	if string(buf) != "original" || string(e.Region.Bytes()[8:16]) != "original" {
		t.Fatal("permitted ops did not move data")
	}
}

func testRevoke(t *testing.T, e *Env) {
	ctx := ctxT(t)
	c := dial(t, e, 0)
	k1 := issue(t, e, 0, 4096, rdma.AccessReadWrite)
	k2 := issue(t, e, 4096, 4096, rdma.AccessReadWrite)
	buf := make([]byte, 64)
	if err := rdma.Write(ctx, c, k1, 0, buf); err != nil {
		t.Fatal(err)
	}
	if err := e.Domain.Revoke(ctx, k1); err != nil {
		t.Fatal(err)
	}
	if err := e.Domain.Revoke(ctx, k1); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpRead, Key: k1, Local: buf}, rdma.StatusRevokedKey)
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpWrite, Key: k1, Local: buf}, rdma.StatusRevokedKey)
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpFetchAdd, Key: k1}, rdma.StatusRevokedKey)
	c2 := dial(t, e, 0)
	expectStatus(t, c2, rdma.WorkRequest{Op: rdma.OpRead, Key: k1, Local: buf}, rdma.StatusRevokedKey)
	// Other keys are unaffected, on both connections.
	expectStatus(t, c, rdma.WorkRequest{Op: rdma.OpWrite, Key: k2, Local: buf}, rdma.StatusOK)
	expectStatus(t, c2, rdma.WorkRequest{Op: rdma.OpRead, Key: k2, Local: buf}, rdma.StatusOK)
	if err := e.Domain.Revoke(ctx, rdma.Key{1}); !errors.Is(err, rdma.ErrUnknownKey) {
		t.Fatalf("revoke of unknown key: %v", err)
	}
}

// testRevokeUnderLoad checks tenant isolation: after Revoke returns, the
// memory server zeroes the slab and no write with the old key may land.
func testRevokeUnderLoad(t *testing.T, e *Env) {
	const base, size = 2 << 20, 256 << 10
	for round := range 3 {
		k := issue(t, e, base, size, rdma.AccessReadWrite)
		stop := make(chan struct{})
		started := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for w := range 2 {
			c := dial(t, e, 32)
			wg.Go(func() {
				payload := make([]byte, 4096)
				for i := range payload {
					payload[i] = 0xEE
				}
				wrs := make([]rdma.WorkRequest, 16)
				cq := make([]rdma.Completion, 16)
				ctx := ctxT(t)
				first := true
				for {
					for i := range wrs {
						wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpWrite, Key: k,
							Offset: uint64((i*4096 + w*65536) % size), Local: payload}
					}
					if err := c.Post(wrs); err != nil {
						return // transport aborted by revoke: fine
					}
					for got := 0; got < len(wrs); {
						n, err := c.Wait(ctx, cq)
						if err != nil {
							return
						}
						got += n
					}
					if first {
						started <- struct{}{}
						first = false
					}
					select {
					case <-stop:
						return
					default:
					}
				}
			})
		}
		<-started
		<-started
		if err := e.Domain.Revoke(ctxT(t), k); err != nil {
			t.Fatalf("round %d: revoke: %v", round, err)
		}
		slab := e.Region.Bytes()[base : base+size]
		clear(slab)
		// The writers keep posting with the revoked key for a while.
		time.Sleep(20 * time.Millisecond)
		close(stop)
		wg.Wait()
		for i, b := range slab {
			if b != 0 {
				t.Fatalf("round %d: byte %d of the zeroed slab was written after Revoke returned", round, i)
			}
		}
	}
}

func testQueueDepth(t *testing.T, e *Env) {
	const depth = 8
	c := dial(t, e, depth)
	k := issue(t, e, 0, 4096, rdma.AccessReadWrite)
	buf := make([]byte, depth*8)
	wrs := make([]rdma.WorkRequest, depth+1)
	for i := range wrs {
		wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: k, Local: buf[i%depth*8 : i%depth*8+8]}
	}
	if err := c.Post(wrs); !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("posting depth+1: %v, want ErrQueueFull", err)
	}
	if err := c.Post(wrs[:depth-1]); err != nil {
		t.Fatal(err)
	}
	if err := c.Post(wrs[depth-1 : depth+1]); !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("posting past depth: %v, want ErrQueueFull", err)
	}
	if err := c.Post(wrs[depth-1 : depth]); err != nil {
		t.Fatal(err)
	}
	// Completions not yet polled still count as outstanding.
	time.Sleep(5 * time.Millisecond)
	if err := c.Post(wrs[:1]); !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("posting with unpolled completions: %v, want ErrQueueFull", err)
	}
	cq := waitAll(t, c, depth)
	for i, ce := range cq {
		if ce.ID != uint64(i) || ce.Status != rdma.StatusOK {
			t.Fatalf("completion %d: %+v (nothing of a refused post may run)", i, ce)
		}
	}
	if n, err := c.Poll(make([]rdma.Completion, 4)); n != 0 || err != nil {
		t.Fatalf("poll after all: %d, %v", n, err)
	}
	if err := c.Post(wrs[:depth]); err != nil {
		t.Fatal(err)
	}
	waitAll(t, c, depth)
}

func testInvalid(t *testing.T, e *Env) {
	c := dial(t, e, 0)
	k := issue(t, e, 0, 4<<20, rdma.AccessReadWrite)
	big := make([]byte, rdma.MaxTransfer+1)
	for _, wr := range []rdma.WorkRequest{
		{Op: 0, Key: k},
		{Op: 99, Key: k},
		{Op: rdma.OpRead, Key: k, Local: big},
		{Op: rdma.OpWrite, Key: k, Local: big},
	} {
		good := rdma.WorkRequest{ID: 1, Op: rdma.OpRead, Key: k, Local: make([]byte, 8)}
		if err := c.Post([]rdma.WorkRequest{good, wr}); !errors.Is(err, rdma.ErrInvalidRequest) {
			t.Fatalf("post of %+v: %v, want ErrInvalidRequest", wr.Op, err)
		}
	}
	if n, err := c.Poll(make([]rdma.Completion, 4)); n != 0 || err != nil {
		t.Fatalf("a refused batch was partly posted: %d completions, %v", n, err)
	}
	expectStatus(t, c, rdma.WorkRequest{ID: 5, Op: rdma.OpRead, Key: k, Local: big[:rdma.MaxTransfer]}, rdma.StatusOK)
}

func testIdle(t *testing.T, e *Env) {
	c := dial(t, e, 0)
	if _, err := c.Wait(ctxT(t), make([]rdma.Completion, 1)); !errors.Is(err, rdma.ErrIdle) {
		t.Fatalf("wait with nothing outstanding: %v, want ErrIdle", err)
	}
	if n, err := c.Poll(make([]rdma.Completion, 1)); n != 0 || err != nil {
		t.Fatalf("poll: %d %v", n, err)
	}
}

func testClose(t *testing.T, e *Env) {
	c := dial(t, e, 0)
	k := issue(t, e, 0, 4096, rdma.AccessReadWrite)
	wrs := []rdma.WorkRequest{{Op: rdma.OpRead, Key: k, Local: make([]byte, 8)}}
	if err := c.Post(wrs); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := c.Post(wrs); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("post after close: %v", err)
	}
	if _, err := c.Poll(make([]rdma.Completion, 1)); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("poll after close: %v", err)
	}
	if _, err := c.Wait(ctxT(t), make([]rdma.Completion, 1)); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
}

func testTransportFailure(t *testing.T, e *Env) {
	const depth = 64
	c := dial(t, e, depth)
	k := issue(t, e, 0, 1<<20, rdma.AccessReadWrite)
	bufs := make([]byte, depth*4096)
	wrs := make([]rdma.WorkRequest, depth)
	for i := range wrs {
		wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: k, Offset: uint64(i * 4096), Local: bufs[i*4096 : (i+1)*4096]}
	}
	if err := c.Post(wrs); err != nil {
		t.Fatal(err)
	}
	e.Kill()
	// Every posted request completes, in order, OK or with StatusTransport.
	cq := waitAll(t, c, depth)
	for i, ce := range cq {
		if ce.ID != uint64(i) || (ce.Status != rdma.StatusOK && ce.Status != rdma.StatusTransport) {
			t.Fatalf("completion %d after kill: %+v", i, ce)
		}
	}
	// The failure surfaces: a Post fails, or its request completes with StatusTransport.
	ctx := ctxT(t)
	for sawFailure := false; !sawFailure; {
		if ctx.Err() != nil {
			t.Fatal("connection never reported the transport failure")
		}
		if err := c.Post(wrs[:1]); err != nil {
			if !errors.Is(err, rdma.ErrTransport) {
				t.Fatalf("post after kill: %v, want ErrTransport", err)
			}
			sawFailure = true
			continue
		}
		ce := waitAll(t, c, 1)[0]
		sawFailure = ce.Status == rdma.StatusTransport
		if !sawFailure && ce.Status != rdma.StatusOK {
			t.Fatalf("op after kill: %+v", ce)
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Post(wrs[:1]); !errors.Is(err, rdma.ErrTransport) {
		t.Fatalf("post on failed connection: %v, want ErrTransport", err)
	}
	if _, err := c.Wait(ctx, make([]rdma.Completion, 1)); !errors.Is(err, rdma.ErrTransport) {
		t.Fatalf("wait on failed, drained connection: %v, want ErrTransport", err)
	}
	c.Close()
	// Reconnect.
	e.Restart()
	c2 := dial(t, e, depth)
	copy(e.Region.Bytes()[8192:], "after restart")
	got := make([]byte, 13)
	if err := rdma.Read(ctx, c2, k, 8192, got); err != nil || string(got) != "after restart" {
		t.Fatalf("read after reconnect: %q %v", got, err)
	}
}

func testZeroAllocs(t *testing.T, e *Env) {
	if testing.Short() {
		t.Skip("short")
	}
	if e.AllocsReason != "" {
		t.Skip(e.AllocsReason)
	}
	c := dial(t, e, 32)
	k := issue(t, e, 0, 1<<20, rdma.AccessReadWrite)
	bufs := make([]byte, 8*4096)
	wrs := make([]rdma.WorkRequest, 8)
	cq := make([]rdma.Completion, 8)
	ctx := context.Background()
	var failed error
	round := func(op rdma.Opcode) {
		for i := range wrs {
			wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: op, Key: k, Offset: uint64(i * 4096), Local: bufs[i*4096 : (i+1)*4096], Add: 1}
		}
		if err := c.Post(wrs); err != nil {
			failed = err
			return
		}
		for got := 0; got < len(wrs); {
			n, err := c.Wait(ctx, cq)
			if err != nil {
				failed = err
				return
			}
			got += n
		}
	}
	for _, op := range []rdma.Opcode{rdma.OpRead, rdma.OpWrite, rdma.OpFetchAdd} {
		round(op) // warm up
		allocs := testing.AllocsPerRun(200, func() { round(op) })
		if failed != nil {
			t.Fatal(failed)
		}
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per batch of 8, want 0", op, allocs)
		}
	}
}
