package tcp

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"rmem/rdma"
)

const benchPage = 4096

type benchServer struct {
	l   *Listener
	key rdma.Key
}

func newBenchServer(b *testing.B) *benchServer {
	d := rdma.NewDomain(rdma.DomainOptions{})
	r, err := rdma.AllocRegion(64<<20, rdma.RegionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Register(r); err != nil {
		b.Fatal(err)
	}
	for i := range r.Bytes() { // populate: memd mlocks its memory
		r.Bytes()[i] = byte(i)
	}
	key, err := d.IssueKey(r, 0, r.Len(), rdma.AccessReadWrite)
	if err != nil {
		b.Fatal(err)
	}
	l, err := Listen("127.0.0.1:0", d, rdma.ListenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		l.Close()
		d.Deregister(context.Background(), r)
		r.Close()
	})
	return &benchServer{l: l, key: key}
}

// rawPingPong is the baseline: a minimal page server over plain TCP. A
// 16-byte request carries a page offset; the response is that 4 KiB page of
// a populated 64 MiB buffer (as the rdma server's region), one goroutine on
// each side, plain net.Conn reads and writes.
type rawPingPong struct {
	ln  net.Listener
	c   net.Conn
	req [16]byte
	buf []byte
	wg  sync.WaitGroup
}

func newRawPingPong(b *testing.B) *rawPingPong {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	p := &rawPingPong{ln: ln, buf: make([]byte, benchPage)}
	mem := make([]byte, 64<<20)
	for i := range mem {
		mem[i] = byte(i)
	}
	p.wg.Go(func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		var req [16]byte
		for {
			if _, err := io.ReadFull(s, req[:]); err != nil {
				return
			}
			off := binary.LittleEndian.Uint64(req[:]) % uint64(len(mem)-benchPage)
			if _, err := s.Write(mem[off : off+benchPage]); err != nil {
				return
			}
		}
	})
	if p.c, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		p.c.Close()
		ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *rawPingPong) op(i int) error {
	binary.LittleEndian.PutUint64(p.req[:], uint64(i%16384)*benchPage)
	if _, err := p.c.Write(p.req[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(p.c, p.buf)
	return err
}

func percentile(s []time.Duration, q float64) time.Duration {
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*q))]
}

// BenchmarkReadLatency measures one 4 KiB READ at a time (Post + Wait)
// against a raw TCP 4 KiB request/response ping-pong, interleaved in blocks
// in the same run, and reports p50/p99 of both and their ratios.
func BenchmarkReadLatency(b *testing.B) {
	s := newBenchServer(b)
	raw := newRawPingPong(b)
	c, err := Dial(context.Background(), s.l.Addr(), rdma.DialOptions{Depth: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, benchPage)
	wrs := []rdma.WorkRequest{{Op: rdma.OpRead, Key: s.key, Local: buf}}
	cq := make([]rdma.Completion, 1)
	ctx := context.Background()
	rdmaOp := func(i int) error {
		wrs[0].ID = uint64(i)
		wrs[0].Offset = uint64(i%16384) * benchPage
		if err := c.Post(wrs); err != nil {
			return err
		}
		if _, err := c.Wait(ctx, cq); err != nil {
			return err
		}
		return cq[0].Err()
	}
	for i := range 2000 { // warm up both
		if err := rdmaOp(i); err != nil {
			b.Fatal(err)
		}
		if err := raw.op(i); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	rawLat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	const block = 256
	for done := 0; done < b.N; {
		n := min(block, b.N-done)
		for i := range n {
			t0 := time.Now()
			if err := rdmaOp(done + i); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		for i := range n {
			t0 := time.Now()
			if err := raw.op(done + i); err != nil {
				b.Fatal(err)
			}
			rawLat = append(rawLat, time.Since(t0))
		}
		b.StartTimer()
		done += n
	}
	b.StopTimer()
	p50, p99 := percentile(lat, 0.50), percentile(lat, 0.99)
	r50, r99 := percentile(rawLat, 0.50), percentile(rawLat, 0.99)
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(r50.Nanoseconds()), "raw-p50-ns")
	b.ReportMetric(float64(r99.Nanoseconds()), "raw-p99-ns")
	b.ReportMetric(float64(p50)/float64(r50), "p50-ratio")
	b.ReportMetric(float64(p99)/float64(r99), "p99-ratio")
}

// rawStreamRate measures the best case of plain TCP on this machine: one
// stream of 256 KiB writes read with 256 KiB reads, for the same number of
// bytes, in GB/s.
func rawStreamRate(b *testing.B, pages int) float64 {
	const chunk = 256 << 10
	total := pages * benchPage
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		buf := make([]byte, chunk)
		for sent := 0; sent < total; sent += chunk {
			if _, err := s.Write(buf[:min(chunk, total-sent)]); err != nil {
				return
			}
		}
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, chunk)
	t0 := time.Now()
	for got := 0; got < total; {
		n, err := c.Read(buf)
		if err != nil {
			b.Fatal(err)
		}
		got += n
	}
	el := time.Since(t0)
	wg.Wait()
	return float64(total) / el.Seconds() / 1e9
}

// BenchmarkReadThroughput keeps N 4 KiB READs outstanding on one
// connection, each landing in its own buffer, and reports GB/s and the
// ratio to a raw TCP stream of the same bytes measured in the same run.
func BenchmarkReadThroughput(b *testing.B) {
	for _, depth := range []int{1, 8, 32, 128} {
		b.Run("outstanding="+itoa(depth), func(b *testing.B) { benchPipelined(b, rdma.OpRead, depth) })
	}
}

// BenchmarkWriteThroughput is the same for 4 KiB WRITEs (eviction of
// dirty pages).
func BenchmarkWriteThroughput(b *testing.B) {
	for _, depth := range []int{8, 32} {
		b.Run("outstanding="+itoa(depth), func(b *testing.B) { benchPipelined(b, rdma.OpWrite, depth) })
	}
}

func benchPipelined(b *testing.B, op rdma.Opcode, depth int) {
	s := newBenchServer(b)
	c, err := Dial(context.Background(), s.l.Addr(), rdma.DialOptions{Depth: depth})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	bufs := make([]byte, depth*benchPage)
	wrs := make([]rdma.WorkRequest, depth)
	cq := make([]rdma.Completion, depth)
	ctx := context.Background()
	next := 0
	mk := func(slot int) rdma.WorkRequest {
		wr := rdma.WorkRequest{ID: uint64(slot), Op: op, Key: s.key,
			Offset: uint64(next%16384) * benchPage, Local: bufs[slot*benchPage : (slot+1)*benchPage]}
		next++
		return wr
	}
	b.SetBytes(benchPage)
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	posted := 0
	for i := range min(depth, b.N) {
		wrs[i] = mk(i)
		posted++
	}
	if err := c.Post(wrs[:posted]); err != nil {
		b.Fatal(err)
	}
	for completed := 0; completed < b.N; {
		n, err := c.Wait(ctx, cq)
		if err != nil {
			b.Fatal(err)
		}
		k := 0
		for _, ce := range cq[:n] {
			if ce.Status != rdma.StatusOK {
				b.Fatal(ce.Err())
			}
			completed++
			if posted < b.N {
				wrs[k] = mk(int(ce.ID))
				k++
				posted++
			}
		}
		if k > 0 {
			if err := c.Post(wrs[:k]); err != nil {
				b.Fatal(err)
			}
		}
	}
	el := time.Since(t0)
	b.StopTimer()
	gbps := float64(b.N*benchPage) / el.Seconds() / 1e9
	// The raw stream is noisy on a shared machine: take the best of
	// three, so the ratio errs against us.
	raw := 0.0
	for range 3 {
		raw = max(raw, rawStreamRate(b, max(b.N, 50000)))
	}
	b.ReportMetric(gbps, "GB/s")
	b.ReportMetric(raw, "raw-GB/s")
	b.ReportMetric(gbps/raw, "raw-ratio")
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
