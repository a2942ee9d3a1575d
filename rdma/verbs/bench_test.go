//go:build verbs

package verbs_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"rmem/rdma"
	_ "rmem/rdma/tcp"
	"rmem/rdma/verbs"
)

// BenchmarkRead4K reads 4 KiB pages with 1 and 32 requests outstanding,
// over verbs (through the bounce arena, and direct into a registered
// buffer) and, as the baseline measured in the same run on the same
// interface, over the tcp provider; it reports verbs/tcp.
func BenchmarkRead4K(b *testing.B) {
	ip := testIP(b)
	region, err := rdma.AllocRegion(64<<20, rdma.RegionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	d := rdma.NewDomain(rdma.DomainOptions{})
	d.Register(region)
	k, err := d.IssueKey(region, 0, region.Len(), rdma.AccessReadWrite)
	if err != nil {
		b.Fatal(err)
	}
	addrs := map[string]string{}
	for _, p := range []string{"tcp", "verbs"} {
		l, err := rdma.Listen(p, net.JoinHostPort(ip, "0"), d, rdma.ListenOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		addrs[p] = l.Addr()
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Deregister(ctx, region)
		region.Close()
	}()
	for _, depth := range []int{1, 32} {
		b.Run("outstanding="+strconv.Itoa(depth), func(b *testing.B) {
			base := readLoop(b, "tcp", addrs["tcp"], k, depth, b.N, false)
			v := readLoop(b, "verbs", addrs["verbs"], k, depth, b.N, false)
			direct := readLoop(b, "verbs", addrs["verbs"], k, depth, b.N, true)
			b.ReportMetric(float64(v.Nanoseconds())/float64(b.N), "verbs-ns/op")
			b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/op")
			b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "tcp-ns/op")
			b.ReportMetric(float64(v)/float64(base), "verbs/tcp")
			b.ReportMetric(float64(direct)/float64(base), "direct/tcp")
		})
	}
}

// readLoop keeps depth 4 KiB READs outstanding until n completed; with
// register, into a buffer registered with RegisterLocal (no bounce copy).
func readLoop(b *testing.B, network, addr string, k rdma.Key, depth, n int, register bool) time.Duration {
	ctx := context.Background()
	c, err := rdma.Dial(ctx, network, addr, rdma.DialOptions{Depth: depth})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, depth*4096)
	if register {
		if err := c.(verbs.LocalRegistrar).RegisterLocal(buf); err != nil {
			b.Fatal(err)
		}
	}
	wrs := make([]rdma.WorkRequest, depth)
	for i := range wrs {
		wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: k, Offset: uint64(i) * 4096, Local: buf[i*4096 : (i+1)*4096]}
	}
	// Warm up: resolve the key, fault the pages in.
	if err := rdma.Read(ctx, c, k, 0, buf[:4096]); err != nil {
		b.Fatal(err)
	}
	cq := make([]rdma.Completion, depth)
	start := time.Now()
	posted, done := 0, 0
	for done < n {
		if m := min(depth-(posted-done), n-posted); m > 0 {
			if err := c.Post(wrs[:m]); err != nil {
				b.Fatal(err)
			}
			posted += m
		}
		got, err := c.Wait(ctx, cq)
		if err != nil {
			b.Fatal(err)
		}
		for _, ce := range cq[:got] {
			if ce.Status != rdma.StatusOK {
				b.Fatalf("%s: %+v", network, ce)
			}
		}
		done += got
	}
	return time.Since(start)
}
