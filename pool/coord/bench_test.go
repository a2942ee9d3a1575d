package coord_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pool"
	"rmem/pool/coord"
	"rmem/pool/pooltest"
	"rmem/pool/store"
	"rmem/pool/store/etcdtest"
)

// BenchmarkScale runs the coordinator in process with 1,000 simulated
// memory servers (64 slabs each, in-memory key issuing) and 10,000 agents
// under a mix of 40% allocate (1 slab × 2 replicas), 40% renew and 20%
// free, and reports ops/s and allocation latency percentiles. The store is
// in memory (the coordinator's own cost) or bbolt (every allocate and free
// is a durable commit), or etcd (a real single-member etcd; every allocate
// and free is a fenced etcd transaction, as a leader writes). alloc-p99/place-p99 is the ratio to the cost of
// the placement decision alone, measured in the same run.
func BenchmarkScale(b *testing.B) {
	for _, kind := range []string{"mem", "bolt", "etcd"} {
		b.Run("store="+kind, func(b *testing.B) {
			var st store.Store = store.NewMem()
			var syncP99 time.Duration
			if kind == "etcd" {
				// A real single-member etcd on this disk (the Debian
				// binary), written through a fenced view as a leader
				// writes.
				srv := etcdtest.Start(b)
				es, err := store.OpenEtcd(store.EtcdOptions{Endpoints: []string{srv.Endpoint}, Prefix: "/bench", MaxTxnOps: etcdtest.MaxTxnOps})
				if err != nil {
					b.Fatal(err)
				}
				defer es.Close()
				put, err := es.Client().Put(context.Background(), "/bench/election/x", "bench")
				if err != nil {
					b.Fatal(err)
				}
				st = es.Fenced(store.Fence{Key: "/bench/election/x", Rev: put.Header.Revision, Owner: "bench"})
			}
			if kind == "bolt" {
				dir := b.TempDir()
				syncP99 = fdatasyncP99(b, dir)
				bs, err := store.OpenBolt(dir)
				if err != nil {
					b.Fatal(err)
				}
				st = bs
			}
			defer st.Close()
			allocP99 := benchScale(b, st)
			if syncP99 > 0 {
				// A bbolt commit costs two fdatasyncs (data, then meta page):
				// the floor a durable allocation cannot go under on this disk.
				b.ReportMetric(float64(syncP99.Microseconds()), "fdatasync-p99-µs")
				b.ReportMetric(float64(allocP99)/float64(2*syncP99), "alloc-p99/2fdatasync-p99")
			}
		})
	}
}

const (
	scaleServers = 1000
	scaleAgents  = 10000
	scaleSlabs   = 64
)

// fdatasyncP99 measures the disk's baseline in dir: p99 of a 4 KiB write
// followed by fdatasync.
func fdatasyncP99(b *testing.B, dir string) time.Duration {
	f, err := os.Create(filepath.Join(dir, "fsync-baseline"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	d := make([]time.Duration, 0, 1000)
	for i := range 1000 {
		if _, err := f.WriteAt(buf, int64(i%64)*4096); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

// benchScale runs the mix and returns the p99 allocation latency.
func benchScale(b *testing.B, st store.Store) time.Duration {
	ctx := context.Background()
	ss := &pooltest.Servers{}
	c, err := coord.New(coord.Options{Store: st, Dialer: ss, SlabSize: 64 << 20, HeartbeatTimeout: time.Hour, Seed: 7})
	if err != nil {
		b.Fatal(err)
	}
	cands := make([]pool.Candidate, scaleServers)
	for i := range scaleServers {
		id := pool.ServerID(fmt.Sprintf("server-%04d", i))
		if _, err := c.Register(ss.Add(id, scaleSlabs, 64<<20, fmt.Sprintf("rack-%02d", i%40))); err != nil {
			b.Fatal(err)
		}
		cands[i] = pool.Candidate{ID: id, Domain: fmt.Sprintf("rack-%02d", i%40), Free: scaleSlabs / 2}
	}
	leases := make([]pool.LeaseID, scaleAgents)
	held := make([][]pool.SlabID, scaleAgents)
	for i := range leases {
		l, err := c.CreateLease(pool.CreateLeaseRequest{Agent: fmt.Sprintf("agent-%05d", i), Node: "n", PID: i + 1, TTL: pool.Duration(time.Hour)})
		if err != nil {
			b.Fatal(err)
		}
		leases[i] = l.ID
	}
	// Warm up: every agent holds two slabs, as a running pool would.
	for i := range leases {
		v, err := c.Allocate(ctx, leases[i], pool.AllocateRequest{Slabs: 2, Replicas: 2})
		if err != nil {
			b.Fatal(err)
		}
		held[i] = append(held[i], v[0].ID, v[1].ID)
	}

	// Baseline: the placement decision alone, over the same number of servers.
	rnd := rand.New(rand.NewPCG(1, 2))
	place := make([]time.Duration, 0, 20000)
	for range 20000 {
		t0 := time.Now()
		if _, err := pool.Place(cands, pool.PlaceRequest{Slabs: 1, Replicas: 2}, rnd); err != nil {
			b.Fatal(err)
		}
		place = append(place, time.Since(t0))
	}

	alloc := make([]time.Duration, 0, b.N)
	var renews, frees int
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		a := rnd.IntN(scaleAgents)
		switch r := rnd.IntN(10); {
		case r < 4 && len(held[a]) < 6:
			t0 := time.Now()
			v, err := c.Allocate(ctx, leases[a], pool.AllocateRequest{Slabs: 1, Replicas: 2})
			alloc = append(alloc, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			held[a] = append(held[a], v[0].ID)
		case r < 8 || len(held[a]) == 0:
			if _, err := c.Renew(leases[a], pool.RenewRequest{}); err != nil {
				b.Fatal(err)
			}
			renews++
		default:
			k := rnd.IntN(len(held[a]))
			if err := c.FreeSlab(ctx, leases[a], held[a][k]); err != nil {
				b.Fatal(err)
			}
			held[a] = slices.Delete(held[a], k, k+1)
			frees++
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return d[min(len(d)-1, int(float64(len(d))*p))]
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(pct(alloc, 0.50).Microseconds()), "alloc-p50-µs")
	b.ReportMetric(float64(pct(alloc, 0.99).Microseconds()), "alloc-p99-µs")
	b.ReportMetric(float64(pct(place, 0.99).Microseconds()), "place-p99-µs")
	if pp := pct(place, 0.99); pp > 0 {
		b.ReportMetric(float64(pct(alloc, 0.99))/float64(pp), "alloc-p99/place-p99")
	}
	b.Logf("N=%d: %d allocations, %d renewals, %d frees; alloc p99 %v (target < 1ms)", b.N, len(alloc), renews, frees, pct(alloc, 0.99))
	return pct(alloc, 0.99)
}
