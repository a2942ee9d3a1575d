// Package elect elects the pool's leader coordinator among several that
// share an etcd store, with etcd's concurrency primitives: each candidate
// holds an etcd lease and campaigns (concurrency.Election) under
// PREFIX/election with its Info as the value; the candidate whose key has
// the lowest creation revision leads. A Term is one tenure: it implements
// coord.Term, and its Fence makes the store's writes conditional on the
// term's election key (store.Etcd.Fenced).
//
// # When a term ends
//
// Writes are fenced by etcd itself. What a coordinator does in memory only
// (renewing leases, taking heartbeats, granting slabs) is fenced by time: a
// term is valid until ValidUntil, computed from the lease's keep-alives:
// a keep-alive sent at t and answered with TTL s proves the lease lives on
// the etcd leader until at least t+s, and no other candidate can be elected
// before the lease expires (its key is deleted only then). Valid stops
// returning nil a margin (a tenth of the TTL, at least 100ms) before that
// bound, without waiting for etcd to answer: a leader cut off from etcd
// stops acting before its successor can be elected. The margin covers
// clock-rate drift and the time between a check and its effect.
//
// It is not for deciding what a leader does (pool/coord) or storing the
// pool's state (pool/store).
//
// Goroutines: each Term runs RoutineKeepAlive until the term ends; Resign
// or the end of the Campaign's context stops it.
package elect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/store"
)

// Info is what a candidate publishes: its id and the control URL clients
// reach it at.
type Info struct {
	ID  string `json:"id"`
	URL string `json:"url"`
}

// ErrInfo is wrapped by errors about an Info (an election value read from
// etcd, or this coordinator's own).
var ErrInfo = errors.New("elect: invalid coordinator info")

// DecodeInfo parses an election value.
func DecodeInfo(b []byte) (Info, error) {
	var in Info
	if err := json.Unmarshal(b, &in); err != nil {
		return Info{}, fmt.Errorf("%w: %v", ErrInfo, err)
	}
	return in, in.Validate()
}

// Validate checks the id and the URL.
func (in Info) Validate() error {
	if in.ID == "" || len(in.ID) > 256 {
		return fmt.Errorf("%w: id %q", ErrInfo, in.ID)
	}
	u, err := url.Parse(in.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: url %q: want http(s)://HOST:PORT", ErrInfo, in.URL)
	}
	return nil
}

// Options configure an Elector.
type Options struct {
	Client *clientv3.Client // required
	Prefix string           // the pool's key prefix (store.Etcd.Prefix); the election is under PREFIX/election
	Self   Info             // required
	// TTL of the candidate's etcd lease, in whole seconds (default 5s;
	// etcd's own floor is about 2s): a leader that dies is replaced about
	// TTL after its last keep-alive.
	TTL time.Duration
	Log *zap.Logger
}

// Elector campaigns for one coordinator and tells who leads.
type Elector struct {
	opts   Options
	pfx    string // PREFIX/election
	margin time.Duration

	mu    sync.Mutex // guards hint, hintAt
	hint  Info
	hintT time.Time
}

// New checks opts and returns an Elector.
func New(opts Options) (*Elector, error) {
	if opts.Client == nil {
		return nil, fmt.Errorf("elect: no etcd client")
	}
	if err := opts.Self.Validate(); err != nil {
		return nil, err
	}
	if opts.TTL == 0 {
		opts.TTL = 5 * time.Second
	}
	if opts.TTL < time.Second || opts.TTL%time.Second != 0 {
		return nil, fmt.Errorf("elect: TTL %v: want a whole number of seconds, at least 1s", opts.TTL)
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	return &Elector{opts: opts, pfx: opts.Prefix + "/election", margin: max(opts.TTL/10, 100*time.Millisecond)}, nil
}

// Term is one tenure as leader. It implements coord.Term.
type Term struct {
	e        *Elector
	rev      int64
	key      string
	lease    clientv3.LeaseID
	session  *concurrency.Session
	election *concurrency.Election
	start    time.Time

	validUntil atomic.Int64 // unix nanoseconds: the lease lives on etcd until at least then
	once       sync.Once
	done       chan struct{}   // closed when the term ends
	stopped    chan struct{}   // closed when RoutineKeepAlive returns
	ctx        context.Context // canceled when the term ends
	cancel     context.CancelFunc
	mu         sync.Mutex // guards err, session, start
	err        error      // why it ended
}

// Campaign blocks until this coordinator leads (then returns its term) or
// ctx ends. A term that begins is valid (Valid) at once.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	cli := e.opts.Client
	ttl := int64(e.opts.TTL / time.Second)
	t0 := time.Now()
	gctx, gcancel := context.WithTimeout(ctx, e.opts.TTL)
	g, err := cli.Grant(gctx, ttl)
	gcancel()
	if err != nil {
		return nil, fmt.Errorf("elect: etcd lease: %w", err)
	}
	tctx, cancel := context.WithCancel(context.Background())
	t := &Term{e: e, lease: g.ID, done: make(chan struct{}), stopped: make(chan struct{}), ctx: tctx, cancel: cancel}
	t.validUntil.Store(t0.Add(time.Duration(g.TTL) * time.Second).UnixNano())
	go t.RoutineKeepAlive(tctx)
	fail := func(err error) (*Term, error) {
		t.end(err, true)
		<-t.stopped
		return nil, err
	}
	// The session keeps the lease alive as well (a stream); the term's own
	// keep-alives are what Valid trusts.
	session, err := concurrency.NewSession(cli, concurrency.WithLease(g.ID), concurrency.WithContext(tctx))
	if err != nil {
		return fail(fmt.Errorf("elect: etcd session: %w", err))
	}
	t.mu.Lock()
	t.session = session
	t.mu.Unlock()
	t.election = concurrency.NewElection(session, e.pfx)
	val, _ := json.Marshal(e.opts.Self)
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	go func() {
		select {
		case <-t.done: // the lease is gone: stop campaigning
			ccancel()
		case <-cctx.Done():
		}
	}()
	if err := t.election.Campaign(cctx, string(val)); err != nil {
		return fail(fmt.Errorf("elect: campaign: %w", err))
	}
	t.key, t.rev = t.election.Key(), t.election.Rev()
	// Campaign returns once every older candidate is gone, even if this
	// one's lease expired meanwhile: check that its key is the leader's.
	lctx, lcancel := context.WithTimeout(ctx, e.opts.TTL)
	resp, err := t.election.Leader(lctx)
	lcancel()
	if err != nil {
		return fail(fmt.Errorf("elect: reading the leader: %w", err))
	}
	if kv := resp.Kvs[0]; string(kv.Key) != t.key || kv.CreateRevision != t.rev {
		return fail(fmt.Errorf("%w: elected, but the leader key is %s (rev %d), not %s (rev %d)", pool.ErrNotLeader, kv.Key, kv.CreateRevision, t.key, t.rev))
	}
	if err := t.Valid(); err != nil {
		return fail(err)
	}
	t.mu.Lock()
	t.start = time.Now()
	t.mu.Unlock()
	e.setHint(e.opts.Self)
	e.opts.Log.Info("elected leader", zap.String("key", t.key), zap.Int64("epoch", t.rev),
		zap.Duration("valid_for", time.Until(t.ValidUntil()).Round(time.Millisecond)))
	return t, nil
}

// RoutineKeepAlive keeps the term's lease alive and its ValidUntil
// current, sending a keep-alive every quarter of the TTL; it ends the term
// when etcd says the lease is gone or when ValidUntil passes unrenewed.
func (t *Term) RoutineKeepAlive(ctx context.Context) {
	defer close(t.stopped)
	every := t.e.opts.TTL / 4
	for {
		left := time.Until(t.ValidUntil()) - t.e.margin
		if left <= 0 {
			t.end(fmt.Errorf("%w: no keep-alive answered by etcd for the lease's TTL (%v)", pool.ErrNotLeader, t.e.opts.TTL), false)
			return
		}
		timer := time.NewTimer(min(every, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		sent := time.Now()
		kctx, cancel := context.WithTimeout(ctx, min(every, max(time.Until(t.ValidUntil())-t.e.margin, time.Millisecond)))
		resp, err := t.e.opts.Client.KeepAliveOnce(kctx, t.lease)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			t.end(fmt.Errorf("%w: the etcd lease expired", pool.ErrNotLeader), false)
			return
		case err != nil:
			if ctx.Err() == nil {
				t.e.opts.Log.Debug("etcd keep-alive failed", zap.Error(err))
			}
		case resp.TTL <= 0:
			t.end(fmt.Errorf("%w: the etcd lease expired", pool.ErrNotLeader), false)
			return
		default:
			if v := sent.Add(time.Duration(resp.TTL) * time.Second).UnixNano(); v > t.validUntil.Load() {
				t.validUntil.Store(v)
			}
		}
	}
}

// ValidUntil is how long the term is known to last without another
// answered keep-alive.
func (t *Term) ValidUntil() time.Time { return time.Unix(0, t.validUntil.Load()) }

// Valid implements coord.Term: nil while the term leads.
func (t *Term) Valid() error {
	select {
	case <-t.done:
		return t.Err()
	default:
	}
	if time.Now().Add(t.e.margin).After(t.ValidUntil()) {
		return fmt.Errorf("%w: leadership not confirmed by etcd since %v ago", pool.ErrNotLeader,
			time.Since(t.ValidUntil().Add(-t.e.opts.TTL)).Round(time.Millisecond))
	}
	return nil
}

// Epoch implements coord.Term: the election key's creation revision.
func (t *Term) Epoch() uint64 { return uint64(t.rev) }

// Lost implements coord.Term.
func (t *Term) Lost(err error) { t.end(err, false) }

// Fence is what the term's store writes are conditional on; their etcd
// requests are canceled when the term ends (a deposed leader does not sit
// on its lock waiting for an etcd it cannot reach).
func (t *Term) Fence() store.Fence {
	return store.Fence{Key: t.key, Rev: t.rev, Owner: t.e.opts.Self.ID, Ctx: t.ctx}
}

// Done is closed when the term ends (Err says why).
func (t *Term) Done() <-chan struct{} { return t.done }

// Err is why the term ended, or nil while it lasts.
func (t *Term) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Resign ends the term and gives up the lease at once, so that another
// candidate leads without waiting for it to expire. Safe to call twice
// and after the term ended.
func (t *Term) Resign(ctx context.Context) {
	t.end(fmt.Errorf("%w: resigned", pool.ErrNotLeader), true)
	<-t.stopped
}

// end ends the term once; revoke gives the lease back (otherwise it is
// left to expire: etcd may be unreachable).
func (t *Term) end(err error, revoke bool) {
	t.once.Do(func() {
		t.mu.Lock()
		t.err = err
		session, start := t.session, t.start
		t.mu.Unlock()
		close(t.done)
		t.cancel()
		if session != nil {
			session.Orphan() // stop its keep-alives; the lease is revoked below or expires
		}
		if revoke {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = t.e.opts.Client.Revoke(ctx, t.lease)
			cancel()
		}
		if !start.IsZero() {
			t.e.opts.Log.Warn("leadership ended", zap.Int64("epoch", t.rev), zap.Error(err),
				zap.Duration("led_for", time.Since(start).Round(time.Millisecond)))
		}
	})
}

// Leader returns the current leader's info and epoch.
func (e *Elector) Leader(ctx context.Context) (Info, int64, error) {
	resp, err := e.opts.Client.Get(ctx, e.pfx+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return Info{}, 0, fmt.Errorf("elect: reading the leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Info{}, 0, fmt.Errorf("%w: no coordinator leads", pool.ErrNotLeader)
	}
	in, err := DecodeInfo(resp.Kvs[0].Value)
	if err != nil {
		return Info{}, 0, fmt.Errorf("elect: leader key %s: %w", resp.Kvs[0].Key, err)
	}
	e.setHint(in)
	return in, resp.Kvs[0].CreateRevision, nil
}

func (e *Elector) setHint(in Info) {
	e.mu.Lock()
	e.hint, e.hintT = in, time.Now()
	e.mu.Unlock()
}

// Hint returns the leader's URL for a not-leader answer: read from etcd at
// most every 250ms, "" when unknown.
func (e *Elector) Hint(ctx context.Context) string {
	e.mu.Lock()
	h, at := e.hint, e.hintT
	e.mu.Unlock()
	if time.Since(at) < 250*time.Millisecond {
		return h.URL
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	in, _, err := e.Leader(ctx)
	if err != nil {
		e.setHint(Info{})
		return ""
	}
	return in.URL
}

// Member is a candidate, as Members lists it.
type Member struct {
	Info
	Leader bool  `json:"leader"`
	Rev    int64 `json:"epoch"` // its key's creation revision (the epoch it leads or would lead with)
}

// Members lists the candidates, the leader first.
func (e *Elector) Members(ctx context.Context) ([]Member, error) {
	resp, err := e.opts.Client.Get(ctx, e.pfx+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("elect: listing the candidates: %w", err)
	}
	var out []Member
	for _, kv := range resp.Kvs {
		in, err := DecodeInfo(kv.Value)
		if err != nil {
			e.opts.Log.Warn("ignoring a bad election value", zap.ByteString("key", kv.Key), zap.Error(err))
			continue
		}
		out = append(out, Member{Info: in, Rev: kv.CreateRevision})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rev < out[j].Rev })
	if len(out) > 0 {
		out[0].Leader = true
	}
	return out, nil
}
