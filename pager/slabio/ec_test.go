package slabio_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"rmem/pager/pagertest"
	"rmem/pager/remote"
	"rmem/pager/slabio"
)

// serverOf returns the pagertest server index holding shard sh of group id.
func serverOf(t *testing.T, s *pagertest.Store, id remote.SlabID, sh int) int {
	t.Helper()
	reps, ok := s.Table().Replicas(slabio.ShardID(id, sh))
	if !ok || len(reps) == 0 {
		t.Fatalf("group %d has no shard %d", id, sh)
	}
	var n int
	if _, err := fmt.Sscanf(reps[0].Server, "server-%d", &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ecSetup(t *testing.T, network string) (*pagertest.Store, remote.PageIO, remote.SlabID, int) {
	s, io, ids := setup(t, pagertest.Options{Servers: 10, ECData: 6, ECParity: 2, SlabSize: 16 * page, Network: network}, 1)
	return s, io, ids[0], int(s.SlabSize() / page)
}

// writePages writes generation gen of the pages of id listed, as one call.
func writePages(t *testing.T, io remote.PageIO, id remote.SlabID, gen uint64, pages ...int) {
	t.Helper()
	ops := make([]remote.PageOp, 0, len(pages))
	for _, p := range pages {
		b := make([]byte, page)
		fill(b, id, uint64(p*page), gen)
		ops = append(ops, remote.PageOp{Slab: id, Off: uint64(p * page), Buf: b})
	}
	if err := io.Write(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatalf("write page %d: %v", op.Off/page, op.Err)
		}
	}
}

// readGens reads every page of id as one call (runs of 4 pages per op) and
// checks each against gens[page]; it returns the ops' errors by page.
func readGens(t *testing.T, io remote.PageIO, id remote.SlabID, gens []uint64) (map[int]error, uint32) {
	t.Helper()
	var ops []remote.PageOp
	for p := 0; p < len(gens); p += 4 {
		ops = append(ops, remote.PageOp{Slab: id, Off: uint64(p * page), Buf: make([]byte, 4*page)})
	}
	if err := io.Read(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	errs := map[int]error{}
	var corrupt uint32
	for _, op := range ops {
		corrupt += op.Corrupt
		if op.Err != nil {
			errs[int(op.Off/page)] = op.Err
			continue
		}
		for j := 0; j < len(op.Buf)/page; j++ {
			p := int(op.Off/page) + j
			check(t, op.Buf[j*page:(j+1)*page], id, uint64(p*page), gens[p])
		}
	}
	return errs, corrupt
}

func TestErasureCoding(t *testing.T) {
	for _, network := range []string{"mem", "tcp"} {
		t.Run(network, func(t *testing.T) {
			s, io, id, pages := ecSetup(t, network)
			gens := make([]uint64, pages)
			all := make([]int, pages)
			for p := range all {
				all[p], gens[p] = p, 1
			}
			writePages(t, io, id, 1, all...) // whole stripes
			// Single pages: their stripes' other pages are read for the
			// parity (read-modify-write).
			for _, p := range []int{0, 7, 13, 50, 95} {
				writePages(t, io, id, 2, p)
				gens[p] = 2
			}
			if errs, _ := readGens(t, io, id, gens); len(errs) > 0 {
				t.Fatalf("healthy: %v", errs)
			}
			// Two servers lost (shards 0 and 7): degraded reads.
			s.Lose(serverOf(t, s, id, 0))
			s.Lose(serverOf(t, s, id, 7))
			if errs, _ := readGens(t, io, id, gens); len(errs) > 0 {
				t.Fatalf("two shards lost: %v", errs)
			}
			// Writes while degraded, one to a lost shard's page.
			writePages(t, io, id, 3, 6, 20, 21)
			gens[6], gens[20], gens[21] = 3, 3, 3
			if errs, _ := readGens(t, io, id, gens); len(errs) > 0 {
				t.Fatalf("written while degraded: %v", errs)
			}
			// The lost shards are rebuilt on other servers; then two
			// more servers go: the rebuilt shards are needed, and right.
			if n, err := s.Repair(context.Background()); err != nil || n != 2 {
				t.Fatalf("repair: moved %d, %v", n, err)
			}
			s.Lose(serverOf(t, s, id, 1))
			s.Lose(serverOf(t, s, id, 6))
			if errs, _ := readGens(t, io, id, gens); len(errs) > 0 {
				t.Fatalf("after the rebuild, two more lost: %v", errs)
			}
			// A third loss in the stripe: pages of lost shards fail
			// loudly, the others still read.
			s.Lose(serverOf(t, s, id, 2))
			errs, _ := readGens(t, io, id, gens)
			if len(errs) == 0 {
				t.Fatal("three shards lost of ec:6+2: every page read")
			}
			for p, err := range errs {
				if !errors.Is(err, remote.ErrLost) {
					t.Fatalf("page run %d: %v, want ErrLost", p, err)
				}
			}
		})
	}
}

func TestErasureCodingChecksums(t *testing.T) {
	s, io, id, pages := ecSetup(t, "mem")
	gens := make([]uint64, pages)
	all := make([]int, pages)
	for p := range all {
		all[p], gens[p] = p, 1
	}
	writePages(t, io, id, 1, all...)
	junk := []byte("SCRIBBLE")
	ctx := context.Background()
	// Two shards of every stripe scribbled (a data shard and a parity
	// one), and a third page of row 3 on another shard.
	for row := 0; row < pages/6; row++ {
		for _, sh := range []int{2, 6} {
			if err := s.Scribble(ctx, id, sh, uint64(row*page+100), junk); err != nil {
				t.Fatal(err)
			}
		}
	}
	errs, corrupt := readGens(t, io, id, gens)
	if len(errs) > 0 {
		t.Fatalf("two bad shards: %v", errs)
	}
	if corrupt == 0 || s.Table().Stats().Corrupt == 0 {
		t.Fatal("bad copies read were not counted")
	}
	if s.Table().Stats().Repaired == 0 {
		t.Fatal("bad data pages were not rewritten")
	}
	// The data shard's pages were rewritten: read again, none is bad.
	before := s.Table().Stats().Corrupt
	if errs, _ := readGens(t, io, id, gens); len(errs) > 0 {
		t.Fatal(errs)
	}
	if after := s.Table().Stats().Corrupt; after != before {
		t.Fatalf("%d bad copies after the repair", after-before)
	}
	// Three bad pages in one stripe: its bad data pages fail loudly.
	for _, sh := range []int{0, 1, 7} {
		if err := s.Scribble(ctx, id, sh, 3*page+8, junk); err != nil {
			t.Fatal(err)
		}
	}
	errs, _ = readGens(t, io, id, gens)
	if len(errs) == 0 {
		t.Fatal("three bad pages of a stripe: every page read")
	}
	for _, err := range errs {
		if !errors.Is(err, remote.ErrCorrupt) {
			t.Fatalf("got %v, want ErrCorrupt", err)
		}
	}
}

// Writers of different pages of the same stripes, at once, keep the
// parity right: with two shards lost afterwards every page reads back.
func TestErasureCodingConcurrentWrites(t *testing.T) {
	s, io0, id, pages := ecSetup(t, "mem")
	gens := make([]uint64, pages)
	var wg sync.WaitGroup
	const writers = 4
	for w := 0; w < writers; w++ {
		io, err := s.OpenIO()
		if err != nil {
			t.Fatal(err)
		}
		defer io.Close()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for round := uint64(1); round <= 5; round++ {
				for p := w; p < pages; p += writers {
					b := make([]byte, page)
					fill(b, id, uint64(p*page), round)
					op := []remote.PageOp{{Slab: id, Off: uint64(p * page), Buf: b}}
					if err := io.Write(context.Background(), op); err != nil || op[0].Err != nil {
						t.Errorf("write %d: %v %v", p, err, op[0].Err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	for p := range gens {
		gens[p] = 5
	}
	s.Lose(serverOf(t, s, id, 3))
	s.Lose(serverOf(t, s, id, 4))
	if errs, _ := readGens(t, io0, id, gens); len(errs) > 0 {
		t.Fatal(errs)
	}
}

func TestErasureCodingLayout(t *testing.T) {
	s, io, id, _ := ecSetup(t, "mem")
	if c, k, m := s.Layout(id); c != 1 || k != 6 || m != 2 {
		t.Fatalf("layout %d %d %d", c, k, m)
	}
	op := []remote.PageOp{{Slab: id, Off: s.SlabSize() - 100, Buf: make([]byte, page)}}
	if err := io.Write(context.Background(), op); err != nil || !errors.Is(op[0].Err, slabio.ErrLayout) {
		t.Fatalf("a write past the end: %v %v", err, op[0].Err)
	}
	if ids := s.Slabs(); len(ids) != 1 || ids[0] != id {
		t.Fatalf("slabs %v: shards listed as slabs", ids)
	}
}

// Ops that cover pages in part (a swap file's unaligned blocks) read and
// write through whole pages: the bytes around them are kept, and their
// checksums hold.
func TestErasureCodingPartialPages(t *testing.T) {
	s, io, id, pages := ecSetup(t, "mem")
	ctx := context.Background()
	model := make([]byte, pages*page)
	fill(model, id, 0, 1)
	all := []remote.PageOp{{Slab: id, Off: 0, Buf: append([]byte(nil), model...)}}
	if err := io.Write(ctx, all); err != nil || all[0].Err != nil {
		t.Fatal(err, all[0].Err)
	}
	for i, w := range []struct{ off, n int }{{100, 50}, {page - 10, 30}, {5*page + 1, 3 * page}, {pages*page - 7, 7}} {
		b := make([]byte, w.n)
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		copy(model[w.off:], b)
		op := []remote.PageOp{{Slab: id, Off: uint64(w.off), Buf: b}}
		if err := io.Write(ctx, op); err != nil || op[0].Err != nil {
			t.Fatalf("write %d: %v %v", i, err, op[0].Err)
		}
	}
	rd := []remote.PageOp{{Slab: id, Off: 3, Buf: make([]byte, len(model)-10)}}
	if err := io.Read(ctx, rd); err != nil || rd[0].Err != nil || string(rd[0].Buf) != string(model[3:len(model)-7]) {
		t.Fatalf("read back: %v %v, equal %v", err, rd[0].Err, string(rd[0].Buf) == string(model[3:len(model)-7]))
	}
	s.Lose(serverOf(t, s, id, 0))
	s.Lose(serverOf(t, s, id, 5))
	rd = []remote.PageOp{{Slab: id, Off: 0, Buf: make([]byte, len(model))}}
	if err := io.Read(ctx, rd); err != nil || rd[0].Err != nil || string(rd[0].Buf) != string(model) {
		t.Fatalf("two shards lost: %v %v", err, rd[0].Err)
	}
}
