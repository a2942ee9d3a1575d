// Package loadgen is the load generator of rmem's services benchmark
// (bench/services): it loads a key-value server with values it can check
// and drives it with GETs, measuring what a service's users judge,
// requests per second and latency quantiles.
//
// It speaks two protocols directly on a net.Conn, a few dozen lines each:
// Redis (RESP2: SET to load, GET to measure) and memcached's text protocol
// (set, get). Keys are drawn uniformly or from a Zipfian distribution
// (Gray et al.'s generator, as YCSB's, theta 0.99, its ranks scattered
// over the key space) with fixed seeds, so that two runs ask for the same
// keys in the same order on each connection. Each connection is a
// goroutine with one request outstanding (closed loop); each request's
// latency goes into a log-linear histogram (1/128 relative buckets, less
// than 1% error), with no allocation per request.
//
// Every value is derived from its key (Value), and every GET's reply is
// compared with it: a wrong or missing value is counted and reported
// (Result.Wrong, Result.Missing, Result.FirstWrong), never ignored, since
// a pager must never return wrong bytes.
//
// It is not a general client library: it sends the few commands the
// benchmark needs, one at a time, and treats anything unexpected in a
// reply as an error of the run.
package loadgen
