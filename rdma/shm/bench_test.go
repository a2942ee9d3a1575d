package shm

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"rmem/rdma"
)

// BenchmarkRead4K measures a 4 KiB READ through shm (Post + Wait, the copy
// done in the caller) and reports its latency percentiles against a plain
// copy of the same pages measured in the same run: the local limit of any
// transport.
func BenchmarkRead4K(b *testing.B) {
	d := rdma.NewDomain(rdma.DomainOptions{})
	r, err := rdma.AllocRegion(64<<20, rdma.RegionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i)
	}
	if err := d.Register(r); err != nil {
		b.Fatal(err)
	}
	k, _ := d.IssueKey(r, 0, r.Len(), rdma.AccessReadWrite)
	l, err := Listen(filepath.Join(b.TempDir(), "b.sock"), d, rdma.ListenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := Dial(context.Background(), l.Addr(), rdma.DialOptions{Depth: 64})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c.Close()
		l.Close()
		d.Deregister(context.Background(), r)
		r.Close()
	})
	const pages = 16384
	buf := make([]byte, 4096)
	wrs := []rdma.WorkRequest{{Op: rdma.OpRead, Key: k, Local: buf}}
	cq := make([]rdma.Completion, 1)
	ctx := context.Background()
	op := func(i int) {
		wrs[0].Offset = uint64(i%pages) * 4096
		if err := c.Post(wrs); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Wait(ctx, cq); err != nil || cq[0].Status != rdma.StatusOK {
			b.Fatal(err, cq[0].Status)
		}
	}
	mem := r.Bytes()
	for i := range pages { // warm both paths
		op(i)
	}
	lat := make([]time.Duration, 0, b.N)
	cp := make([]time.Duration, 0, b.N)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		op(i)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	for i := range b.N {
		off := (i % pages) * 4096
		t0 := time.Now()
		copy(buf, mem[off:off+4096])
		cp = append(cp, time.Since(t0))
	}
	slices.Sort(lat)
	slices.Sort(cp)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	c50 := cp[len(cp)/2]
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(c50.Nanoseconds()), "memcpy-p50-ns")
	b.ReportMetric(float64(p50)/float64(max(c50, 1)), "memcpy-ratio")
}
