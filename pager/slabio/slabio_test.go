package slabio_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rmem/pager/pagertest"
	"rmem/pager/remote"
	"rmem/pager/slabio"
	"rmem/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const page = 4096

func fill(b []byte, slab remote.SlabID, off, gen uint64) {
	for w := 0; w+8 <= len(b); w += 8 {
		binary.LittleEndian.PutUint64(b[w:], uint64(slab)<<48^off<<8^gen^uint64(w))
	}
}

func check(t *testing.T, b []byte, slab remote.SlabID, off, gen uint64) {
	t.Helper()
	want := make([]byte, len(b))
	fill(want, slab, off, gen)
	if string(want) != string(b) {
		t.Fatalf("slab %d off %d: data differs from generation %d", slab, off, gen)
	}
}

// writeAll writes generation gen of n pages of every slab and returns the ops.
func writeAll(t *testing.T, io remote.PageIO, ids []remote.SlabID, n int, gen uint64) {
	t.Helper()
	var ops []remote.PageOp
	for _, id := range ids {
		for p := 0; p < n; p++ {
			b := make([]byte, page)
			fill(b, id, uint64(p*page), gen)
			ops = append(ops, remote.PageOp{Slab: id, Off: uint64(p * page), Buf: b})
		}
	}
	if err := io.Write(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatalf("write slab %d off %d: %v", op.Slab, op.Off, op.Err)
		}
	}
}

// readAll reads n pages of every slab and returns the per-op errors.
func readAll(t *testing.T, io remote.PageIO, ids []remote.SlabID, n int, gen uint64) []error {
	t.Helper()
	var ops []remote.PageOp
	for _, id := range ids {
		for p := 0; p < n; p++ {
			ops = append(ops, remote.PageOp{Slab: id, Off: uint64(p * page), Buf: make([]byte, page)})
		}
	}
	if err := io.Read(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(ops))
	for i, op := range ops {
		errs[i] = op.Err
		if op.Err == nil {
			check(t, op.Buf, op.Slab, op.Off, gen)
		}
	}
	return errs
}

func allNil(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
}

func allIs(t *testing.T, errs []error, want error) {
	t.Helper()
	for i, err := range errs {
		if !errors.Is(err, want) {
			t.Fatalf("op %d: got %v, want %v", i, err, want)
		}
	}
}

func setup(t *testing.T, opts pagertest.Options, slabs int) (*pagertest.Store, remote.PageIO, []remote.SlabID) {
	s := pagertest.New(t, opts)
	ids, err := s.Alloc(context.Background(), slabs)
	if err != nil {
		t.Fatal(err)
	}
	io, err := s.OpenIO()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { io.Close() })
	return s, io, ids
}

func TestReadWriteFailover(t *testing.T) {
	for _, network := range []string{"mem", "tcp"} {
		t.Run(network, func(t *testing.T) {
			s, io, ids := setup(t, pagertest.Options{Servers: 3, Replicas: 2, SlabSize: 64 * page, Network: network}, 3)
			// A fresh slab reads as zeros.
			allNil(t, readAllZero(t, io, ids))
			writeAll(t, io, ids, 64, 1)
			allNil(t, readAll(t, io, ids, 64, 1))
			s.Kill(0)
			allNil(t, readAll(t, io, ids, 64, 1))
			if st := s.Table().Stats(); st.Failovers == 0 {
				t.Fatalf("no failover counted with server 0 killed: %+v", st)
			}
			// Writes go to the surviving replicas; the killed one is stale.
			writeAll(t, io, ids, 64, 2)
			allNil(t, readAll(t, io, ids, 64, 2))
			for _, id := range ids {
				reps, _ := s.Table().Replicas(id)
				for _, r := range reps {
					if r.Server == "server-0" && r.State != slabio.Lost {
						t.Fatalf("slab %d: replica on the killed server is %v after a missed WRITE, want lost", id, r.State)
					}
				}
			}
		})
	}
}

func readAllZero(t *testing.T, io remote.PageIO, ids []remote.SlabID) []error {
	ops := []remote.PageOp{}
	for _, id := range ids {
		ops = append(ops, remote.PageOp{Slab: id, Off: 5 * page, Buf: make([]byte, page)})
	}
	if err := io.Read(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	errs := []error{}
	for _, op := range ops {
		for _, c := range op.Buf {
			if c != 0 {
				t.Fatalf("fresh slab %d not zero", op.Slab)
			}
		}
		errs = append(errs, op.Err)
	}
	return errs
}

func TestUnreachableIsNotLost(t *testing.T) {
	s, io, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 16 * page}, 2)
	writeAll(t, io, ids, 16, 1)
	s.Kill(0)
	s.Kill(1)
	allIs(t, readAll(t, io, ids, 16, 1), remote.ErrUnavailable)
	// A WRITE that reaches nobody leaves both replicas trusted.
	ops := []remote.PageOp{{Slab: ids[0], Off: 0, Buf: make([]byte, page)}}
	io.Write(context.Background(), ops)
	if !errors.Is(ops[0].Err, remote.ErrUnavailable) {
		t.Fatalf("write to dead servers: %v", ops[0].Err)
	}
	reps, _ := s.Table().Replicas(ids[0])
	for _, r := range reps {
		if r.State != slabio.Healthy {
			t.Fatalf("replica %s is %v after a WRITE reached nobody", r.Server, r.State)
		}
	}
}

// A WRITE that only a Filling replica (being copied to by Migrate) took is
// not written: the healthy replica that missed it stays trusted, and the
// slab still reads (here: as unreachable, never as lost). Marking it
// stale left a slab with nothing to read and killed a program with SIGBUS
// while one server of two was stopped (TestMemagentReplicaStop, in CI).
func TestWriteOnlyFillingIsNotWritten(t *testing.T) {
	s, io, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 16 * page}, 1)
	writeAll(t, io, ids, 16, 1)
	if err := s.Table().SetState(ids[0], "server-1", slabio.Filling); err != nil {
		t.Fatal(err)
	}
	s.Kill(0)
	ops := []remote.PageOp{{Slab: ids[0], Off: 0, Buf: make([]byte, page)}}
	io.Write(context.Background(), ops)
	if !errors.Is(ops[0].Err, remote.ErrUnavailable) {
		t.Fatalf("write taken by the Filling replica alone: %v, want ErrUnavailable", ops[0].Err)
	}
	reps, _ := s.Table().Replicas(ids[0])
	for _, r := range reps {
		if r.Server == "server-0" && r.State != slabio.Healthy {
			t.Fatalf("the healthy replica that missed the WRITE is %v, want healthy", r.State)
		}
	}
	allIs(t, readAll(t, io, ids, 16, 1), remote.ErrUnavailable)
}

func TestLost(t *testing.T) {
	s, io, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 16 * page}, 2)
	writeAll(t, io, ids, 16, 1)
	s.Lose(0)
	allNil(t, readAll(t, io, ids, 16, 1))
	s.Lose(1)
	allIs(t, readAll(t, io, ids, 16, 1), remote.ErrLost)
	ops := []remote.PageOp{{Slab: 999, Buf: make([]byte, page)}}
	io.Read(context.Background(), ops)
	if !errors.Is(ops[0].Err, remote.ErrUnknownSlab) {
		t.Fatalf("unknown slab: %v", ops[0].Err)
	}
}

func TestFreedSlabReadsLost(t *testing.T) {
	s, io, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 16 * page}, 1)
	writeAll(t, io, ids, 1, 1)
	reps, _ := s.Table().Replicas(ids[0])
	s.Free(context.Background(), ids)
	// Someone still holding the old key (a stale table) gets a revoked key:
	// the data is gone, never zeros.
	s.Table().Put(ids[0], reps)
	allIs(t, readAll(t, io, ids, 1, 1), remote.ErrLost)
}

// Migration while writers run: the copy never overwrites newer data.
func TestMigrateUnderWrites(t *testing.T) {
	for _, network := range []string{"mem", "tcp"} {
		t.Run(network, func(t *testing.T) {
			const pages = 256 // 1 MiB slab: 4 copy chunks
			s, io, ids := setup(t, pagertest.Options{Servers: 3, Replicas: 1, SlabSize: pages * page, Network: network}, 1)
			writeAll(t, io, ids, pages, 1)
			from, _ := s.Table().Replicas(ids[0])
			var wg sync.WaitGroup
			stop := make(chan struct{})
			gen := make([]uint64, pages)
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, _ := s.OpenIO()
				defer w.Close()
				b := make([]byte, page)
				ops := make([]remote.PageOp, 1)
				for g := uint64(2); ; g++ {
					select {
					case <-stop:
						return
					default:
					}
					p := int(g*7) % pages
					fill(b, ids[0], uint64(p*page), g)
					ops[0] = remote.PageOp{Slab: ids[0], Off: uint64(p * page), Buf: b}
					if err := w.Write(context.Background(), ops); err != nil || ops[0].Err != nil {
						t.Errorf("write: %v %v", err, ops[0].Err)
						return
					}
					gen[p] = g
				}
			}()
			var idx int
			for i := range s.Servers() {
				if "server-"+string(rune('0'+i)) == from[0].Server {
					idx = i
				}
			}
			moved, err := s.Repair(context.Background(), idx)
			close(stop)
			wg.Wait()
			if err != nil || moved != 1 {
				t.Fatalf("repair: moved %d, %v", moved, err)
			}
			reps, _ := s.Table().Replicas(ids[0])
			if len(reps) != 1 || reps[0].Server == from[0].Server || reps[0].State != slabio.Healthy {
				t.Fatalf("after migration: %+v", reps)
			}
			s.Kill(idx) // only the new replica may answer
			for p := 0; p < pages; p++ {
				ops := []remote.PageOp{{Slab: ids[0], Off: uint64(p * page), Buf: make([]byte, page)}}
				if err := io.Read(context.Background(), ops); err != nil || ops[0].Err != nil {
					t.Fatal(err, ops[0].Err)
				}
				g := gen[p]
				if g == 0 {
					g = 1
				}
				check(t, ops[0].Buf, ids[0], uint64(p*page), g)
			}
			if s.Table().Stats().Copied != pages*page {
				t.Fatalf("copied %d bytes", s.Table().Stats().Copied)
			}
		})
	}
}

func TestNoAllocs(t *testing.T) {
	_, io, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 64 * page}, 1)
	ops := make([]remote.PageOp, 32)
	for i := range ops {
		ops[i] = remote.PageOp{Slab: ids[0], Off: uint64(i * page), Buf: make([]byte, page)}
	}
	ctx := context.Background()
	io.Write(ctx, ops) // dial
	if n := testing.AllocsPerRun(50, func() { io.Write(ctx, ops) }); n != 0 {
		t.Errorf("Write: %v allocs per call", n)
	}
	if n := testing.AllocsPerRun(50, func() { io.Read(ctx, ops) }); n != 0 {
		t.Errorf("Read: %v allocs per call", n)
	}
}

// TestRegisterLocal: RegisterLocal's own rules, and that providers without
// registered memory (mem, tcp) ignore it: ops on the buffers move as
// before and no connection counts a registration. The verbs side runs in
// the rdma test guest (rdma/verbs TestSlabioRegisterLocal).
func TestRegisterLocal(t *testing.T) {
	for _, network := range []string{"mem", "tcp"} {
		t.Run(network, func(t *testing.T) {
			s, pio, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 16 * page, Network: network}, 1)
			io := pio.(*slabio.IO)
			buf := make([]byte, 16*page)
			if err := io.RegisterLocal(buf[:8*page]); err != nil {
				t.Fatal(err)
			}
			if err := io.RegisterLocal(buf[4*page : 12*page]); !errors.Is(err, slabio.ErrLocalOverlap) {
				t.Fatalf("overlapping range: %v, want ErrLocalOverlap", err)
			}
			if err := io.RegisterLocal(nil); !errors.Is(err, slabio.ErrLocalEmpty) {
				t.Fatalf("empty range: %v, want ErrLocalEmpty", err)
			}
			// Registered before and after the first dial.
			writeAll(t, io, ids, 16, 1)
			if err := io.RegisterLocal(buf[8*page:]); err != nil {
				t.Fatal(err)
			}
			ops := make([]remote.PageOp, 16)
			for p := range ops {
				ops[p] = remote.PageOp{Slab: ids[0], Off: uint64(p * page), Buf: buf[p*page : (p+1)*page]}
			}
			if err := io.Read(context.Background(), ops); err != nil {
				t.Fatal(err)
			}
			for _, op := range ops {
				if op.Err != nil {
					t.Fatal(op.Err)
				}
				check(t, op.Buf, op.Slab, op.Off, 1)
			}
			if st := s.Table().Stats(); st.LocalRegistered != 0 || st.LocalRefused != 0 {
				t.Fatalf("%s connections counted registrations: %+v", network, st)
			}
			for i := 0; i < slabio.MaxLocal-2; i++ {
				if err := io.RegisterLocal(make([]byte, page)); err != nil {
					t.Fatal(err)
				}
			}
			if err := io.RegisterLocal(make([]byte, page)); !errors.Is(err, slabio.ErrTooManyLocal) {
				t.Fatalf("range %d: %v, want ErrTooManyLocal", slabio.MaxLocal+1, err)
			}
		})
	}
}

// freezer is a TCP proxy to a memory server that can stop forwarding while
// keeping its connections open: a server that accepts requests and never
// answers (stopped, or cut off without a reset).
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
	closed atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezer(t *testing.T, backend string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln}
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, b)
			f.mu.Unlock()
			f.wg.Go(func() { f.pipe(b, c) })
			f.wg.Go(func() { f.pipe(c, b) })
		}
	})
	t.Cleanup(func() {
		f.closed.Store(true)
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		for n > 0 && f.frozen.Load() && !f.closed.Load() {
			time.Sleep(time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// TestSilentServerFailsOver: a server that stops answering (its connection
// stays open) fails the ops waiting for it after the op deadline: READs
// move to the other replica, WRITEs skip it (its replicas become stale),
// and nothing waits forever.
func TestSilentServerFailsOver(t *testing.T) {
	s, pio, ids := setup(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 16 * page, Network: "tcp"}, 2)
	io := pio.(*slabio.IO)
	io.SetOpTimeout(300 * time.Millisecond)
	writeAll(t, io, ids, 16, 1)
	// Route every replica on server-0 through a proxy.
	var f *freezer
	for _, id := range ids {
		reps, _ := s.Table().Replicas(id)
		reps = append([]slabio.Replica(nil), reps...)
		for i := range reps {
			if reps[i].Server == "server-0" {
				if f == nil {
					f = newFreezer(t, reps[i].Addr)
				}
				reps[i].Addr = f.ln.Addr().String()
			}
		}
		s.Table().Put(id, reps)
	}
	allNil(t, readAll(t, io, ids, 16, 1))
	f.frozen.Store(true)
	start := time.Now()
	allNil(t, readAll(t, io, ids, 16, 1))
	if st := s.Table().Stats(); st.Stalls == 0 || st.Failovers == 0 {
		t.Fatalf("stats %+v: want a stall and failovers", st)
	}
	// Skipped now: the next WRITE does not wait for it again.
	writeAll(t, io, ids, 16, 2)
	allNil(t, readAll(t, io, ids, 16, 2))
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("reads and writes around a silent server took %v", took)
	}
	for _, id := range ids {
		reps, _ := s.Table().Replicas(id)
		for _, r := range reps {
			if r.Server == "server-0" && r.State != slabio.Lost {
				t.Fatalf("slab %d: replica on the silent server is %v after missing a WRITE, want lost", id, r.State)
			}
		}
	}
}

// flip changes one byte of page p of replica ri of slab id in the server's
// memory, behind the table's back.
func flip(t *testing.T, s *pagertest.Store, id remote.SlabID, ri, p int, gen uint64) {
	t.Helper()
	b := make([]byte, page)
	fill(b, id, uint64(p*page), gen)
	if err := s.Scribble(context.Background(), id, ri, uint64(p*page+100), []byte{b[100] ^ 0x40}); err != nil {
		t.Fatal(err)
	}
}

// TestChecksums: a copy that changed in a server's memory is never
// returned. With another replica the op reads the good copy and rewrites
// the bad one; with none, the page is lost (ErrCorrupt, an ErrLost), and an
// op of several pages still returns its good pages. A page written in part
// has no sum, so it is not mistaken for a bad one.
func TestChecksums(t *testing.T) {
	for _, network := range []string{"mem", "tcp"} {
		t.Run(network, func(t *testing.T) {
			s, io, ids := setup(t, pagertest.Options{Servers: 3, Replicas: 2, SlabSize: 64 * page, Network: network}, 1)
			id := ids[0]
			var reported []string
			s.Table().OnCorrupt(func(got remote.SlabID, server string, off uint64) {
				reported = append(reported, fmt.Sprintf("%d %s %d", got, server, off))
			})
			writeAll(t, io, ids, 64, 1)

			// One replica's copy changed: read from the other, repaired.
			flip(t, s, id, 0, 5, 1)
			flip(t, s, id, 0, 6, 1)
			allNil(t, readAll(t, io, ids, 64, 1))
			st := s.Table().Stats()
			if st.Corrupt != 2 || st.Repaired != 2 {
				t.Fatalf("after two bad copies on one replica: corrupt %d repaired %d, want 2 and 2", st.Corrupt, st.Repaired)
			}
			if want := fmt.Sprintf("%d %s %d", id, "server-0", 5*page); len(reported) != 1 || reported[0] != want {
				t.Fatalf("reported %q, want once: %q", reported, want)
			}
			allNil(t, readAll(t, io, ids, 64, 1))
			if st2 := s.Table().Stats(); st2.Corrupt != st.Corrupt {
				t.Fatalf("the repaired pages failed their sums again: %+v", st2)
			}

			// Every copy of page 7 changed: lost, loudly.
			flip(t, s, id, 0, 7, 1)
			flip(t, s, id, 1, 7, 1)
			ops := []remote.PageOp{{Slab: id, Off: 7 * page, Buf: make([]byte, page)}}
			if err := io.Read(context.Background(), ops); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(ops[0].Err, remote.ErrCorrupt) || !errors.Is(ops[0].Err, remote.ErrLost) || ops[0].Corrupt != 2 {
				t.Fatalf("page with two bad copies: err %v, corrupt %d; want ErrCorrupt (an ErrLost), 2", ops[0].Err, ops[0].Corrupt)
			}

			// In one op of 16 pages, the other 15 still arrive; a page bad on
			// one replica and another bad on the other both come back.
			flip(t, s, id, 0, 3, 1)
			flip(t, s, id, 1, 9, 1)
			ops = []remote.PageOp{{Slab: id, Off: 0, Buf: make([]byte, 16*page)}}
			io.Read(context.Background(), ops)
			if !errors.Is(ops[0].Err, remote.ErrCorrupt) {
				t.Fatalf("16 pages, page 7 bad everywhere: err %v", ops[0].Err)
			}
			for p := 0; p < 16; p++ {
				if p != 7 {
					check(t, ops[0].Buf[p*page:(p+1)*page], id, uint64(p*page), 1)
				}
			}
			ops = []remote.PageOp{{Slab: id, Off: 0, Buf: make([]byte, 7*page)}}
			io.Read(context.Background(), ops)
			if ops[0].Err != nil {
				t.Fatalf("pages 0-6 (page 3 bad on replica 0, repaired): %v", ops[0].Err)
			}
			for p := 0; p < 7; p++ {
				check(t, ops[0].Buf[p*page:(p+1)*page], id, uint64(p*page), 1)
			}

			// A write of part of a page drops its sum: what it left reads back.
			part := []remote.PageOp{{Slab: id, Off: 20*page + 8, Buf: []byte("a partial write")}}
			if err := io.Write(context.Background(), part); err != nil || part[0].Err != nil {
				t.Fatal(err, part[0].Err)
			}
			ops = []remote.PageOp{{Slab: id, Off: 20 * page, Buf: make([]byte, page)}}
			io.Read(context.Background(), ops)
			if ops[0].Err != nil || ops[0].Corrupt != 0 || string(ops[0].Buf[8:23]) != "a partial write" {
				t.Fatalf("page written in part: err %v corrupt %d", ops[0].Err, ops[0].Corrupt)
			}
		})
	}
}

// The next agent checks the pages the one before it wrote: with
// PersistSums, a table that adopts the slab (Adopt) loads its sums and
// catches a copy that changed since; a slab put as new starts without
// sums (no page taken for bad by a sum it did not write); Remove deletes
// the file.
func TestPersistSums(t *testing.T) {
	dir := t.TempDir()
	s := pagertest.New(t, pagertest.Options{Servers: 1, Replicas: 1, SlabSize: 16 * page})
	s.Table().PersistSums(dir)
	ids, err := s.Alloc(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	io := s.Table().NewIO()
	defer io.Close()
	writeAll(t, io, ids, 16, 1)
	reps, _ := s.Table().Replicas(ids[0])
	flip(t, s, ids[0], 0, 4, 1)

	next := func(adopt bool) *slabio.IO {
		tab := slabio.NewTable(16*page, rdma.DialOptions{Depth: 64})
		tab.PersistSums(dir)
		put := tab.Put
		if adopt {
			put = tab.Adopt
		}
		if err := put(ids[0], reps); err != nil {
			t.Fatal(err)
		}
		nio := tab.NewIO()
		t.Cleanup(func() { nio.Close() })
		return nio
	}
	ops := []remote.PageOp{{Slab: ids[0], Off: 4 * page, Buf: make([]byte, page)}}
	next(true).Read(context.Background(), ops)
	if !errors.Is(ops[0].Err, remote.ErrCorrupt) {
		t.Fatalf("the next agent read a page changed since the last one wrote it: %v, want ErrCorrupt", ops[0].Err)
	}
	// A slab put as new: the file is made anew, nothing is checked.
	next(false).Read(context.Background(), ops)
	if ops[0].Err != nil || ops[0].Corrupt != 0 {
		t.Fatalf("a slab put as new over an old sum file: %v, %d bad", ops[0].Err, ops[0].Corrupt)
	}
	next(true).Read(context.Background(), ops)
	if ops[0].Err != nil {
		t.Fatalf("adopted after a Put that reset its file: %v", ops[0].Err)
	}
	s.Free(context.Background(), ids)
	if left, _ := filepath.Glob(filepath.Join(dir, "sums-*")); len(left) != 0 {
		t.Fatalf("sum files left after the slab was freed: %v", left)
	}
}
