// Package faultproxy is a TCP proxy that injects deterministic, seeded
// faults into the streams it forwards: a fixed delay, jitter, and "loss".
// It sits on the links a chaos test puts it on (tests/chaos) by being the
// address a memory server or coordinator advertises.
//
// TCP hides what packets do: a lost segment is retransmitted after the
// retransmission timeout, and segments that arrive out of order are held
// until the gap fills, so the application sees late data, in order, with
// everything behind it late too (head-of-line blocking). The proxy models
// exactly that at the stream level: each chunk it reads is delivered
// after Delay plus a uniform jitter in [0, Jitter) plus, with probability
// Loss, RTO; chunks of one direction of one connection keep their order
// (a chunk waits for the one before it). Chunks of different connections
// overtake each other freely: that is the reordering the applications
// above TCP can see. Every decision comes from a PCG seeded with Seed and
// the connection's and direction's numbers, so a run's fault schedule per
// connection is the same for the same seed.
//
// It is not a network emulator (no bandwidth limit, no packet-level
// faults: the kernel has no netem here) and not for production.
package faultproxy

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are what the proxy injects. The zero value forwards unchanged.
type Faults struct {
	Delay  time.Duration // added to every chunk
	Jitter time.Duration // plus uniform [0, Jitter)
	Loss   float64       // probability that a chunk is "lost": delivered RTO late
	RTO    time.Duration // default 200ms (Linux's minimum retransmission timeout)
}

// Stats count what the proxy did.
type Stats struct {
	Conns, Chunks, Lost uint64
	Bytes               uint64
	Delayed             time.Duration // total delay added
}

// Proxy forwards connections accepted on its listener to its target.
type Proxy struct {
	ln     net.Listener
	target string
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	seed   uint64
	faults [2]atomic.Pointer[Faults] // client→target, target→client

	conns, chunks, lost, bytes atomic.Uint64
	delayed                    atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   map[net.Conn]bool
}

// New serves ln, forwarding to target through dial (nil: net.Dialer).
func New(ln net.Listener, target string, dial func(ctx context.Context, network, addr string) (net.Conn, error), seed uint64) *Proxy {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{ln: ln, target: target, dial: dial, seed: seed, ctx: ctx, cancel: cancel, open: map[net.Conn]bool{}}
	p.faults[0].Store(&Faults{})
	p.faults[1].Store(&Faults{})
	p.wg.Add(1)
	go p.routineAccept()
	return p
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetFaults changes the faults for chunks read from now on, in both
// directions.
func (p *Proxy) SetFaults(f Faults) { p.SetFaultsEach(f, f) }

// SetFaultsEach sets the faults of each direction: up (client to target)
// and down (target to client). A delay on one direction only adds it to
// the round trip once, as netem on one interface does.
func (p *Proxy) SetFaultsEach(up, down Faults) {
	for i, f := range []Faults{up, down} {
		if f.RTO == 0 {
			f.RTO = 200 * time.Millisecond
		}
		p.faults[i].Store(&f)
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{Conns: p.conns.Load(), Chunks: p.chunks.Load(), Lost: p.lost.Load(), Bytes: p.bytes.Load(), Delayed: time.Duration(p.delayed.Load())}
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines. Safe to call twice.
func (p *Proxy) Close() error {
	p.cancel()
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		c.Close()
		return false
	}
	p.open[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) routineAccept() {
	defer p.wg.Done()
	var n uint64
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		n++
		p.conns.Add(1)
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.routineConn(c, n)
	}
}

func (p *Proxy) routineConn(c net.Conn, n uint64) {
	defer p.wg.Done()
	defer p.untrack(c)
	dctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	up, err := p.dial(dctx, "tcp", p.target)
	cancel()
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(c, up, &p.faults[0], rand.New(rand.NewPCG(p.seed, 2*n))) }()
	go func() { defer wg.Done(); p.pipe(up, c, &p.faults[1], rand.New(rand.NewPCG(p.seed, 2*n+1))) }()
	wg.Wait()
}

type chunk struct {
	b  []byte
	at time.Time
}

// Schedule returns the delay of each chunk in turn that a direction with
// this generator gets: the decisions pipe makes (exported for tests).
func Schedule(f Faults, rnd *rand.Rand) (time.Duration, bool) {
	d := f.Delay
	if f.Jitter > 0 {
		d += time.Duration(rnd.Int64N(int64(f.Jitter)))
	}
	lost := f.Loss > 0 && rnd.Float64() < f.Loss
	if lost {
		d += f.RTO
	}
	return d, lost
}

// pipe copies src to dst, each chunk at its scheduled time, in order.
// When either side ends, both are closed.
func (p *Proxy) pipe(src, dst net.Conn, faults *atomic.Pointer[Faults], rnd *rand.Rand) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			if d := time.Until(ch.at); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-p.ctx.Done():
					t.Stop()
					return
				}
			}
			if _, err := dst.Write(ch.b); err != nil {
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	var last time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f := faults.Load()
			d, lost := Schedule(*f, rnd)
			at := time.Now().Add(d)
			if at.Before(last) {
				at = last // in order, as TCP delivers
			}
			last = at
			p.chunks.Add(1)
			p.bytes.Add(uint64(n))
			p.delayed.Add(int64(d))
			if lost {
				p.lost.Add(1)
			}
			select {
			case q <- chunk{b: append([]byte(nil), buf[:n]...), at: at}:
			case <-done:
				src.Close()
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			break
		}
	}
	close(q)
	<-done
}
