package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/coord"
	"rmem/pool/httpapi"
	"rmem/pool/pooltest"
	"rmem/pool/store"
)

// BenchmarkAllocateHTTP measures allocate+free of one slab × 2 replicas
// through the real HTTP stack (client, auth, JSON, coordinator) with 1,000
// in-memory servers, against the same operations called in process in the
// same run (http/inproc ratio).
func BenchmarkAllocateHTTP(b *testing.B) {
	ctx := context.Background()
	ss := &pooltest.Servers{}
	c, err := coord.New(coord.Options{Store: store.NewMem(), Dialer: ss, SlabSize: 64 << 20, HeartbeatTimeout: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		if _, err := c.Register(ss.Add(pool.ServerID(fmt.Sprintf("s%04d", i)), 64, 64<<20, "")); err != nil {
			b.Fatal(err)
		}
	}
	api := http.NewServeMux()
	if err := c.Routes(api); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.Auth(token, false, api))
	defer srv.Close()
	cl, _ := client.New(srv.URL, client.Options{Token: token})
	defer cl.CloseIdleConnections()
	l, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "bench", TTL: pool.Duration(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	measure := func(n int, alloc func() (pool.SlabID, error), free func(pool.SlabID) error) []time.Duration {
		lat := make([]time.Duration, 0, n)
		for range n {
			t0 := time.Now()
			id, err := alloc()
			lat = append(lat, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			if err := free(id); err != nil {
				b.Fatal(err)
			}
		}
		slices.Sort(lat)
		return lat
	}
	inproc := measure(5000, func() (pool.SlabID, error) {
		v, err := c.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 1, Replicas: 2})
		if err != nil {
			return 0, err
		}
		return v[0].ID, nil
	}, func(id pool.SlabID) error { return c.FreeSlab(ctx, l.ID, id) })
	b.ResetTimer()
	over := measure(b.N, func() (pool.SlabID, error) {
		v, err := cl.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 1, Replicas: 2})
		if err != nil {
			return 0, err
		}
		return v[0].ID, nil
	}, func(id pool.SlabID) error { return cl.FreeSlab(ctx, l.ID, id) })
	b.StopTimer()
	p := func(d []time.Duration, q float64) time.Duration { return d[min(len(d)-1, int(float64(len(d))*q))] }
	b.ReportMetric(float64(p(over, 0.5).Microseconds()), "http-p50-µs")
	b.ReportMetric(float64(p(over, 0.99).Microseconds()), "http-p99-µs")
	b.ReportMetric(float64(p(inproc, 0.99).Microseconds()), "inproc-p99-µs")
	b.ReportMetric(float64(p(over, 0.99))/float64(p(inproc, 0.99)), "http/inproc-p99")
}
