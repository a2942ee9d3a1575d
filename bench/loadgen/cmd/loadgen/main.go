// Command loadgen drives a Redis or memcached server with the load
// generator of rmem's services benchmark (package rmem/bench/loadgen): it
// loads every key with a value derived from it, then sends GETs from N
// connections, one request at a time each, with uniform or Zipfian keys,
// checks every value and prints requests/s and latency quantiles.
//
//	go run ./bench/loadgen/cmd/loadgen -proto redis -addr /tmp/redis.sock -keys 216000 -requests 200000
//
// It exits 1 when a value comes back wrong or missing, 2 on any other
// failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"rmem/bench/loadgen"
)

func main() {
	proto := flag.String("proto", "redis", "the server's protocol: redis or memcached")
	addr := flag.String("addr", "127.0.0.1:6379", "the server: HOST:PORT, or a Unix socket (unix:PATH or an absolute path)")
	keys := flag.Int("keys", 216_000, "keys")
	size := flag.Int("value-size", 1024, "bytes of each value")
	conns := flag.Int("conns", 8, "connections, one request at a time each")
	requests := flag.Int("requests", 200_000, "GETs measured per distribution")
	warmup := flag.Int("warmup", -1, "GETs of each distribution sent before its measured ones, not measured (-1: one per key)")
	dists := flag.String("dist", "uniform,zipf", "key distributions, comma-separated: uniform, zipf")
	theta := flag.Float64("theta", 0.99, "the Zipfian distribution's theta")
	seed := flag.Uint64("seed", 1, "seed of the key draws")
	load := flag.Bool("load", true, "load every key first (SET); without it, the server must hold them already")
	flag.Parse()
	if *warmup < 0 {
		*warmup = *keys
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	g, err := loadgen.Open(ctx, loadgen.Config{Protocol: loadgen.Protocol(*proto), Dial: loadgen.Dialer(*addr),
		Keys: *keys, ValueSize: *size, Conns: *conns, Seed: *seed})
	if err != nil {
		fail(err)
	}
	defer g.Close()
	if *load {
		res, err := g.Load(ctx)
		if err != nil {
			fail(err)
		}
		report("load (SET)", &res)
	}
	bad := false
	for _, d := range strings.Split(*dists, ",") {
		k, err := loadgen.NewKeys(d, *keys, *theta, *seed)
		if err != nil {
			fail(err)
		}
		if *warmup > 0 {
			res, err := g.Get(ctx, k, *warmup)
			if err != nil {
				fail(err)
			}
			bad = check(d+" warm-up", &res) || bad
		}
		res, err := g.Get(ctx, k, *requests)
		if err != nil {
			fail(err)
		}
		report("GET "+d, &res)
		bad = check("GET "+d, &res) || bad
	}
	if bad {
		os.Exit(1)
	}
}

func report(what string, r *loadgen.Result) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	fmt.Printf("%-12s %9d requests in %7.3f s: %9.0f/s  p50 %8.1f µs  p99 %8.1f µs  p99.9 %8.1f µs  max %8.1f µs\n",
		what, r.Requests, r.Elapsed.Seconds(), r.PerSecond(), us(r.Latency.Quantile(0.5)), us(r.Latency.Quantile(0.99)),
		us(r.Latency.Quantile(0.999)), us(r.Latency.Max()))
}

// check says loudly when values came back wrong or missing.
func check(what string, r *loadgen.Result) bool {
	if r.Bad() == 0 {
		return false
	}
	fmt.Fprintf(os.Stderr, "loadgen: %s: WRONG VALUES: %d wrong, %d missing of %d; first: %s\n", what, r.Wrong, r.Missing, r.Requests, r.FirstWrong)
	return true
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(2)
}
