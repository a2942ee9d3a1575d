package swapfs

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"rmem/pager/pagertest"
	"rmem/pager/remote"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testSlab = 64 << 10 // 16 blocks per slab: requests cross slabs

func newFS(t testing.TB, size uint64, popts pagertest.Options) (*FS, *pagertest.Store) {
	t.Helper()
	if popts.SlabSize == 0 {
		popts.SlabSize = testSlab
	}
	st := pagertest.New(t, popts)
	fs, err := New(Options{Size: size, Store: st, Retry: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs, st
}

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestOptions(t *testing.T) {
	st := pagertest.New(t, pagertest.Options{SlabSize: testSlab})
	for _, o := range []Options{
		{Size: 1 << 20},
		{Size: 0, Store: st},
		{Size: 1000, Store: st},
		{Size: 1 << 20, Store: st, Workers: -1},
		{Size: 1 << 20, Store: st, Retry: -time.Second},
	} {
		if _, err := New(o); !errors.Is(err, ErrOptions) {
			t.Errorf("New(%+v) = %v, want ErrOptions", o, err)
		}
	}
}

func TestSegments(t *testing.T) {
	var got []segment
	segments(4000, 5000, func(s segment) bool { got = append(got, s); return true })
	want := []segment{{0, 4000, 96}, {1, 0, 4096}, {2, 0, 808}}
	if !slices.Equal(got, want) {
		t.Fatalf("segments = %v, want %v", got, want)
	}
}

func TestWorkerAddMerges(t *testing.T) {
	w := &worker{ops: make([]remote.PageOp, 0, 2), idx: make([]SlabIndex, 0, 2)}
	buf := make([]byte, 3*BlockSize)
	other := make([]byte, BlockSize)
	steps := []struct {
		id   remote.SlabID
		off  uint64
		buf  []byte
		ok   bool
		nops int
	}{
		{1, 0, buf[:BlockSize], true, 1},
		{1, BlockSize, buf[BlockSize : 2*BlockSize], true, 1}, // contiguous: merged
		{1, 3 * BlockSize, buf[2*BlockSize:], true, 2},        // gap in the slab
		{1, 4 * BlockSize, other, false, 2},                   // other buffer, batch full
	}
	for i, s := range steps {
		if ok := w.add(0, s.id, s.off, s.buf); ok != s.ok || len(w.ops) != s.nops {
			t.Fatalf("step %d: ok %v, %d ops; want %v, %d", i, ok, len(w.ops), s.ok, s.nops)
		}
	}
	if len(w.ops[0].Buf) != 2*BlockSize {
		t.Fatalf("merged op has %d bytes", len(w.ops[0].Buf))
	}
}

// TestReadWriteAt checks data across slab boundaries, unaligned and
// vectored writes, zeros for unwritten blocks with no traffic, and lazy
// slab allocation.
func TestReadWriteAt(t *testing.T) {
	const size = 1 << 20
	fs, st := newFS(t, size, pagertest.Options{Servers: 2, Replicas: 2})
	model := make([]byte, size)

	// Never written: zeros, no pool traffic, no slab.
	got := make([]byte, 3*BlockSize)
	if err := fs.ReadAt(got, 5*BlockSize); err != nil {
		t.Fatal(err)
	}
	if s := fs.Stats(); !bytes.Equal(got, model[:len(got)]) || s.PoolReadOps != 0 || s.ZeroBlocks != 3 || s.Slabs != 0 {
		t.Fatalf("unwritten read: zeros %v, stats %+v", bytes.Equal(got, model[:len(got)]), s)
	}

	writes := []struct {
		off  uint64
		bufs []int // sizes of the vectored buffers
	}{
		{0, []int{BlockSize}},
		{testSlab - 100, []int{50, 4096, 150}}, // straddles a slab boundary and buffers
		{3*testSlab + 7, []int{2 * testSlab}},
		{size - BlockSize, []int{BlockSize}},
	}
	for i, w := range writes {
		var bufs [][]byte
		off := w.off
		for j, n := range w.bufs {
			b := pattern(i*10+j, n)
			copy(model[off:], b)
			off += uint64(n)
			bufs = append(bufs, b)
		}
		if err := fs.WriteAt(bufs, w.off); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	got = make([]byte, size)
	if err := fs.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("read back differs from what was written")
	}
	s := fs.Stats()
	// Slabs 0, 1, 3, 4, 5 and 15 were written.
	if s.Slabs != 6 {
		t.Errorf("%d slabs allocated, want 6", s.Slabs)
	}
	if total, _ := st.Allocated(); total != 6 {
		t.Errorf("store allocated %d slabs, want 6", total)
	}
	if s.PoolWriteBytes != 4096+4296+2*testSlab+4096 {
		t.Errorf("pool write bytes %d", s.PoolWriteBytes)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	if _, held := st.Allocated(); held != 0 {
		t.Errorf("%d slabs held after Close", held)
	}
}

// TestFailover: with two replicas a lost server is survived; with both
// lost a READ fails with ErrLost, never zeros; an unreachable pool fails
// with ErrUnavailable after the retry time.
func TestFailover(t *testing.T) {
	fs, st := newFS(t, 1<<20, pagertest.Options{Servers: 2, Replicas: 2})
	want := pattern(1, 2*testSlab)
	if err := fs.WriteAt([][]byte{want}, 0); err != nil {
		t.Fatal(err)
	}
	st.Lose(0)
	got := make([]byte, len(want))
	if err := fs.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after losing one replica: err %v, equal %v", err, bytes.Equal(got, want))
	}
	st.Lose(1)
	if err := fs.ReadAt(got, 0); !errors.Is(err, remote.ErrLost) {
		t.Fatalf("after losing both replicas: %v, want ErrLost", err)
	}

	fs2, st2 := newFS(t, 1<<20, pagertest.Options{Servers: 1})
	if err := fs2.WriteAt([][]byte{want[:BlockSize]}, 0); err != nil {
		t.Fatal(err)
	}
	st2.Kill(0)
	if err := fs2.ReadAt(got[:BlockSize], 0); !errors.Is(err, remote.ErrUnavailable) {
		t.Fatalf("unreachable: %v, want ErrUnavailable", err)
	}
	if fs2.Stats().Retries == 0 {
		t.Error("no retry counted")
	}
}

func TestNoAllocPerRequest(t *testing.T) {
	fs, _ := newFS(t, 1<<20, pagertest.Options{})
	buf := pattern(3, 64*BlockSize)
	bufs := [][]byte{buf}
	if err := fs.WriteAt(bufs, 0); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(50, func() {
		if err := fs.WriteAt(bufs, 0); err != nil {
			t.Fatal(err)
		}
		if err := fs.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per WRITE+READ, want 0", n)
	}
	// The same through the FUSE entry points, as go-fuse calls them.
	rin := &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: swapIno}, Offset: 0, Size: uint32(len(buf))}
	win := &fuse.WriteIn{InHeader: fuse.InHeader{NodeId: swapIno}, Offset: 0, Size: uint32(len(buf))}
	n = testing.AllocsPerRun(50, func() {
		if _, st := fs.Writev(nil, win, bufs); !st.Ok() {
			t.Fatal(st)
		}
		r, st := fs.Read(nil, rin, buf)
		if !st.Ok() || r.Size() != len(buf) {
			t.Fatal(st)
		}
		r.Done()
	})
	if n != 0 {
		t.Errorf("%v allocations per FUSE WRITE+READ, want 0", n)
	}
}

// FuzzReadWrite checks the FS against a byte-slice model for arbitrary
// offsets, lengths and buffer splits.
func FuzzReadWrite(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 200, 17, 9, 255, 4, 4})
	f.Add([]byte{255, 255, 255, 255, 0, 0, 1, 1})
	f.Fuzz(func(t *testing.T, prog []byte) {
		const size = 256 << 10
		fs, _ := newFS(t, size, pagertest.Options{})
		model := make([]byte, size)
		for i := 0; i+4 <= len(prog) && i < 64; i += 4 {
			off := (uint64(prog[i])<<8 | uint64(prog[i+1])) * 4 % size
			n := min((uint64(prog[i+2])+1)*97, size-off)
			if prog[i+3]&1 == 0 {
				got := make([]byte, n)
				if err := fs.ReadAt(got, off); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, model[off:off+n]) {
					t.Fatalf("read %d+%d differs", off, n)
				}
				continue
			}
			data := pattern(i, int(n))
			split := uint64(prog[i+3]) % (n + 1)
			if err := fs.WriteAt([][]byte{data[:split], data[split:]}, off); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], data)
		}
		got := make([]byte, size)
		if err := fs.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatal("final content differs")
		}
	})
}

func FuzzParseStats(f *testing.F) {
	f.Add([]byte(`{"size":4096,"pool_write_bytes":12}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStats(b)
		if err != nil && s != (Stats{}) {
			t.Fatal("error with a non-zero Stats")
		}
	})
}

func needMount(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE with mount(2) needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
}

// TestMount serves the filesystem for real and uses it with O_DIRECT.
func TestMount(t *testing.T) {
	needMount(t)
	const size = 4 << 20
	fs, _ := newFS(t, size, pagertest.Options{})
	dir := t.TempDir()
	srv, err := Mount(dir, fs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })

	names, err := os.ReadDir(dir)
	if err != nil || len(names) != 2 || names[0].Name() != StatsName || names[1].Name() != SwapName {
		t.Fatalf("ReadDir = %v, %v", names, err)
	}
	fi, err := os.Stat(filepath.Join(dir, SwapName))
	if err != nil || fi.Size() != size {
		t.Fatalf("stat: %v, %v", fi, err)
	}
	fd, err := unix.Open(filepath.Join(dir, SwapName), unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// O_DIRECT wants aligned memory: mmap'ed.
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	copy(buf, pattern(5, len(buf)))
	want := bytes.Clone(buf)
	if n, err := unix.Pwrite(fd, buf, 1<<20); err != nil || n != len(buf) {
		t.Fatalf("pwrite: %d, %v", n, err)
	}
	clear(buf)
	if n, err := unix.Pread(fd, buf, 1<<20); err != nil || n != len(buf) || !bytes.Equal(buf, want) {
		t.Fatalf("pread: %d, %v, equal %v", n, err, bytes.Equal(buf, want))
	}
	if n, err := unix.Pread(fd, buf, 0); err != nil || n != len(buf) || !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatalf("pread of unwritten blocks: %d, %v", n, err)
	}
	if n, err := unix.Pwrite(fd, buf[:BlockSize], size); err == nil {
		t.Fatalf("write past the end: %d bytes, no error", n)
	}

	b, err := os.ReadFile(filepath.Join(dir, StatsName))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseStats(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.PoolWriteBytes != 1<<20 || s.PoolReadBytes != 1<<20 || s.ZeroBlocks != 256 || s.Size != size {
		t.Fatalf("stats after 1 MiB written and read, 1 MiB of zeros: %+v", s)
	}
	if s.Writes > 2 {
		t.Errorf("1 MiB written in %d requests: the kernel did not send large requests", s.Writes)
	}
	unix.Close(fd)
	if err := srv.Unmount(); err != nil {
		t.Fatal(err)
	}
	srv.Wait()
}

func TestCollector(t *testing.T) {
	fs, _ := newFS(t, 1<<20, pagertest.Options{})
	if err := fs.WriteAt([][]byte{pattern(1, 3*BlockSize)}, 0); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(fs.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			if c := m.GetCounter(); c != nil {
				got[key] = c.GetValue()
			} else {
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	for k, v := range map[string]float64{
		"rmem_swapfs_pool_bytes_total{write}": 3 * BlockSize, "rmem_swapfs_pool_bytes_total{read}": 0,
		"rmem_swapfs_blocks_written": 3, "rmem_swapfs_slabs": 1, "rmem_swapfs_size_bytes": 1 << 20,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// A block whose pool copy changed in a server's memory: read from the
// other replica (exact, counted); with no other copy the READ fails
// (ErrCorrupt, an ErrLost: EIO to the kernel), never wrong bytes.
func TestChecksums(t *testing.T) {
	for _, replicas := range []int{2, 1} {
		fs, st := newFS(t, 1<<20, pagertest.Options{Servers: 2, Replicas: replicas})
		want := pattern(3, 2*testSlab)
		if err := fs.WriteAt([][]byte{want}, 0); err != nil {
			t.Fatal(err)
		}
		for _, id := range st.Slabs() {
			if err := st.Scribble(context.Background(), id, 0, 5*BlockSize+9, []byte("SCRIBBLE")); err != nil {
				t.Fatal(err)
			}
		}
		got := make([]byte, len(want))
		err := fs.ReadAt(got, 0)
		switch {
		case replicas == 2 && (err != nil || !bytes.Equal(got, want)):
			t.Fatalf("one bad copy of two: err %v, equal %v", err, bytes.Equal(got, want))
		case replicas == 1 && !errors.Is(err, remote.ErrCorrupt):
			t.Fatalf("the only copy bad: %v, want ErrCorrupt", err)
		}
		if n := fs.Stats().ChecksumErrors; n == 0 {
			t.Fatalf("%d replicas: no checksum error counted", replicas)
		}
	}
}

// TestErasureCoded: the swap file over erasure-coded slabs (ec:3+2): blocks
// and unaligned writes read back exactly, and still do with two of the
// five servers lost.
func TestErasureCoded(t *testing.T) {
	const size = 1 << 20
	fs, st := newFS(t, size, pagertest.Options{Servers: 6, ECData: 3, ECParity: 2})
	model := make([]byte, size)
	for i, w := range []struct{ off, n int }{{0, size}, {7 * BlockSize, BlockSize}, {testSlab - 100, 300}, {size - 5000, 5000}} {
		b := pattern(i+40, w.n)
		copy(model[w.off:], b)
		if err := fs.WriteAt([][]byte{b}, uint64(w.off)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	got := make([]byte, size)
	if err := fs.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, model))
	}
	st.Lose(0)
	st.Lose(3)
	if err := fs.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("two servers lost: %v, equal %v", err, bytes.Equal(got, model))
	}
}
