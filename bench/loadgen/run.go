package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Config is a load generator's: which server, how many keys and
// connections.
type Config struct {
	Protocol Protocol
	// Dial opens one connection to the server.
	Dial func(ctx context.Context) (net.Conn, error)
	// Keys is the number of keys (indexes 0 to Keys-1) the server holds
	// after Load; ValueSize the length of each value.
	Keys      int
	ValueSize int
	// Conns is the number of connections (default 8), each a goroutine
	// with one request at a time.
	Conns int
	// Seed seeds every connection's key draws (with the connection's
	// index): the same seed asks the same keys in the same order.
	Seed uint64
}

func (c *Config) validate() error {
	switch {
	case c.Dial == nil:
		return errors.New("loadgen: Config.Dial is nil")
	case c.Keys < 2 || c.Keys > MaxKeys:
		return fmt.Errorf("loadgen: Config.Keys %d: want 2 to %d", c.Keys, MaxKeys)
	case c.ValueSize < KeyLen+1 || c.ValueSize > 1<<20:
		return fmt.Errorf("loadgen: Config.ValueSize %d: want %d to 1 MiB", c.ValueSize, KeyLen+1)
	case c.Conns < 0:
		return fmt.Errorf("loadgen: Config.Conns %d: want 0 (the default, 8) or more", c.Conns)
	case c.Protocol != Redis && c.Protocol != Memcached:
		return fmt.Errorf("loadgen: Config.Protocol %q: want redis or memcached", c.Protocol)
	}
	return nil
}

// Result is one phase of requests.
type Result struct {
	Requests uint64        // requests answered
	Elapsed  time.Duration // from the first request sent to the last reply
	Latency  Histogram     // each request's, as its connection saw it
	// Wrong counts values that differ from what was loaded, Missing keys
	// the server did not have; FirstWrong describes the first of either.
	Wrong, Missing uint64
	FirstWrong     string
}

// PerSecond returns the requests answered per second.
func (r *Result) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Bad returns the requests whose value was wrong or missing.
func (r *Result) Bad() uint64 { return r.Wrong + r.Missing }

// Gen is a load generator with its connections open.
type Gen struct {
	cfg     Config
	workers []*worker
}

// worker is one connection and everything its requests need, allocated
// once.
type worker struct {
	nc    net.Conn
	conn  Conn
	rng   *rand.Rand
	key   [KeyLen]byte
	want  []byte // the value expected
	got   []byte // the value read
	res   Result
	index int
}

// Open validates cfg and opens its connections.
func Open(ctx context.Context, cfg Config) (*Gen, error) {
	if cfg.Conns == 0 {
		cfg.Conns = 8
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Gen{cfg: cfg}
	for i := range cfg.Conns {
		nc, err := cfg.Dial(ctx)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("loadgen: connection %d: %w", i, err)
		}
		c, _ := NewConn(cfg.Protocol, nc) // validated
		g.workers = append(g.workers, &worker{nc: nc, conn: c, index: i,
			rng:  rand.New(rand.NewPCG(cfg.Seed, uint64(i))),
			want: make([]byte, cfg.ValueSize), got: make([]byte, cfg.ValueSize)})
	}
	return g, nil
}

// Close closes the connections; it is safe to call more than once.
func (g *Gen) Close() error {
	for _, w := range g.workers {
		w.nc.Close()
	}
	return nil
}

// Load stores every key's value (Value), each connection a share of the
// keys in order. Its Result times the SETs.
func (g *Gen) Load(ctx context.Context) (Result, error) {
	n := uint64(len(g.workers))
	return g.phase(ctx, func(w *worker) error {
		for i := uint64(w.index); i < uint64(g.cfg.Keys); i += n {
			start := time.Now()
			if err := w.conn.Set(Key(w.key[:], i), Value(w.want, i)); err != nil {
				return fmt.Errorf("set %s: %w", w.key[:], err)
			}
			w.res.Latency.Record(time.Since(start))
			w.res.Requests++
		}
		return nil
	})
}

// Get sends requests GETs, shared among the connections, for keys drawn
// from keys, and checks each value against the one loaded.
func (g *Gen) Get(ctx context.Context, keys Keys, requests int) (Result, error) {
	n := len(g.workers)
	return g.phase(ctx, func(w *worker) error {
		mine := requests / n
		if w.index < requests%n {
			mine++
		}
		for range mine {
			if err := w.get(keys.Next(w.rng)); err != nil {
				return err
			}
		}
		return nil
	})
}

// get asks for key index i, times the request and checks the value.
func (w *worker) get(i uint64) error {
	key := Key(w.key[:], i)
	start := time.Now()
	v, err := w.conn.Get(key, w.got)
	w.res.Latency.Record(time.Since(start))
	w.res.Requests++
	switch {
	case errors.Is(err, ErrMiss):
		w.res.Missing++
		if w.res.FirstWrong == "" {
			w.res.FirstWrong = fmt.Sprintf("key %s: missing", key)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get %s: %w", key, err)
	}
	want := Value(w.want, i)
	if string(v) != string(want) {
		w.res.Wrong++
		if w.res.FirstWrong == "" {
			w.res.FirstWrong = describeWrong(key, v, want)
		}
	}
	return nil
}

// phase runs do on every connection at once and merges their results.
// When ctx ends, the connections are closed to stop it.
func (g *Gen) phase(ctx context.Context, do func(*worker) error) (Result, error) {
	stop := context.AfterFunc(ctx, func() { g.Close() })
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, len(g.workers))
	start := time.Now()
	for i, w := range g.workers {
		w.res = Result{}
		wg.Go(func() {
			if err := do(w); err != nil {
				errs[i] = fmt.Errorf("loadgen: connection %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	var out Result
	out.Elapsed = time.Since(start)
	for _, w := range g.workers {
		out.Requests += w.res.Requests
		out.Latency.Merge(&w.res.Latency)
		out.Wrong += w.res.Wrong
		out.Missing += w.res.Missing
		if out.FirstWrong == "" {
			out.FirstWrong = w.res.FirstWrong
		}
	}
	var err error
	failed := 0
	for _, e := range errs {
		if e != nil {
			if failed == 0 {
				err = e
			}
			failed++
		}
	}
	if failed > 1 {
		err = fmt.Errorf("%w (and %d more connections failed)", err, failed-1)
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("loadgen: %w (%w)", ctx.Err(), err)
	}
	return out, err
}
