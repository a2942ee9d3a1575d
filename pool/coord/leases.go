package coord

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/store"
)

// CreateLease starts a lease for an agent.
func (c *Coordinator) CreateLease(req pool.CreateLeaseRequest) (pool.Lease, error) {
	if err := req.Validate(); err != nil {
		return pool.Lease{}, err
	}
	now := c.clock.Now()
	rec := pool.Lease{ID: newID(), Agent: req.Agent, Node: req.Node, PID: req.PID, TTL: req.TTL, Created: now, Expires: now.Add(req.TTL.Std())}
	secret := pool.RandomHex(32)
	stored := leaseRecord{Lease: rec, SecretSHA256: hashSecret(secret)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Leases, string(rec.ID), &stored) }); err != nil {
		return pool.Lease{}, fmt.Errorf("coord: create lease: %w", err)
	}
	c.leases[rec.ID] = &lease{rec: rec, secret: stored.SecretSHA256, slabs: map[pool.SlabID]*pool.Slab{}}
	c.log.Info("lease created", zap.String("lease", string(rec.ID)), zap.String("agent", rec.Agent), zap.String("node", rec.Node), zap.Int("pid", rec.PID))
	rec.Secret = secret
	return rec, nil
}

// Renew extends a live lease by its TTL and returns the events about its
// slabs. An expired lease cannot be renewed (pool.ErrLeaseExpired).
// Renewal is not written to the store (see the package comment).
// The agent's report (req) is kept for the views, in memory only.
func (c *Coordinator) Renew(id pool.LeaseID, req pool.RenewRequest) (pool.RenewResponse, error) {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	l, err := c.liveLeaseLocked(id, now)
	if err != nil {
		return pool.RenewResponse{}, err
	}
	// Checked again under mu (it may have waited on a store write): a
	// renewal is in memory only, so nothing else fences it.
	if err := c.Leading(); err != nil {
		return pool.RenewResponse{}, err
	}
	l.rec.Expires = now.Add(l.rec.TTL.Std())
	l.report = req
	slabs := make([]*pool.Slab, 0, len(l.slabs))
	for _, sl := range l.slabs {
		slabs = append(slabs, sl)
	}
	sort.Slice(slabs, func(i, j int) bool { return slabs[i].ID < slabs[j].ID })
	ev := pool.EventsFor(make([]pool.Event, 0), slabs, c.getSrvLocked)
	return pool.RenewResponse{Lease: l.rec, Events: ev}, nil
}

// DeleteLease ends a lease and frees its slabs.
func (c *Coordinator) DeleteLease(ctx context.Context, id pool.LeaseID) error {
	c.mu.Lock()
	l := c.leases[id]
	if l == nil {
		c.mu.Unlock()
		return fmt.Errorf("%w: lease %q", pool.ErrNotFound, id)
	}
	jobs, err := c.dropLeasesLocked([]*lease{l})
	c.mu.Unlock()
	if err != nil {
		return err
	}
	c.freeSoon(ctx, jobs)
	return nil
}

// FreeSlab frees one slab of a live lease (every replica).
func (c *Coordinator) FreeSlab(ctx context.Context, id pool.LeaseID, sid pool.SlabID) error {
	c.mu.Lock()
	l, sl, err := c.slabOfLocked(id, sid, c.clock.Now())
	if err != nil {
		c.mu.Unlock()
		return err
	}
	err = c.opts.Store.Update(func(tx store.Tx) error { return tx.Delete(store.Slabs, slabKey(sid)) })
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("coord: free slab %d: %w", sid, err)
	}
	delete(l.slabs, sid)
	delete(c.slabs, sid)
	var jobs []freeJob
	for _, r := range sl.Replicas {
		jobs = c.addFreeLocked(jobs, r)
	}
	c.mu.Unlock()
	c.m.slabsFreed.Add(1)
	c.freeSoon(ctx, jobs)
	return nil
}

// Migrated records that the agent copied slab sid off server from to its
// replacement: the replica on from is dropped and freed. The slab must keep
// at least one other replica. The free runs behind the answer: from is
// usually a server that is failing (stopped, cut off, draining), and a
// free to it may wait out CallTimeout, while the agent waits for this
// answer before it renews its lease or restores other replicas.
func (c *Coordinator) Migrated(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) error {
	c.mu.Lock()
	_, sl, err := c.slabOfLocked(id, sid, c.clock.Now())
	if err != nil {
		c.mu.Unlock()
		return err
	}
	at := -1
	for i, r := range sl.Replicas {
		if r.Server == from {
			at = i
		}
	}
	if at < 0 {
		c.mu.Unlock()
		return &pool.FieldError{Field: "server", Msg: fmt.Sprintf("slab %d has no replica on server %q", sid, from)}
	}
	if len(sl.Replicas) == 1 {
		c.mu.Unlock()
		return fmt.Errorf("%w: slab %d has no replica besides the one on %q: ask for a replacement first", pool.ErrConflict, sid, from)
	}
	next := *sl
	next.Replicas = append(append([]pool.Replica(nil), sl.Replicas[:at]...), sl.Replicas[at+1:]...)
	if err := c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Slabs, slabKey(sid), &next) }); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("coord: migrated slab %d: %w", sid, err)
	}
	old := sl.Replicas[at]
	sl.Replicas = next.Replicas
	jobs := c.addFreeLocked(nil, old)
	c.mu.Unlock()
	c.log.Info("replica migrated", zap.Uint64("slab", uint64(sid)), zap.String("from", string(from)))
	c.freeLater(ctx, jobs)
	return nil
}

// dropLeasesLocked deletes leases and their slabs from the store and the
// state, and returns the frees to run.
func (c *Coordinator) dropLeasesLocked(ls []*lease) ([]freeJob, error) {
	err := c.opts.Store.Update(func(tx store.Tx) error {
		for _, l := range ls {
			for sid := range l.slabs {
				if err := tx.Delete(store.Slabs, slabKey(sid)); err != nil {
					return err
				}
			}
			if err := tx.Delete(store.Leases, string(l.rec.ID)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("coord: delete leases: %w", err)
	}
	var jobs []freeJob
	for _, l := range ls {
		for sid, sl := range l.slabs {
			delete(c.slabs, sid)
			for _, r := range sl.Replicas {
				jobs = c.addFreeLocked(jobs, r)
			}
		}
		c.m.slabsFreed.Add(float64(len(l.slabs)))
		delete(c.leases, l.rec.ID)
		c.log.Info("lease ended", zap.String("lease", string(l.rec.ID)), zap.String("agent", l.rec.Agent), zap.Int("slabs", len(l.slabs)))
	}
	return jobs, nil
}

// addFreeLocked adds the free of replica r to jobs, if its server instance
// still holds it. The index stays used until the server confirms.
func (c *Coordinator) addFreeLocked(jobs []freeJob, r pool.Replica) []freeJob {
	s := c.servers[r.Server]
	if s == nil || s.rec.Instance != r.Instance || s.rec.State == pool.ServerLeft {
		return jobs // its memory is gone with the instance
	}
	e := pool.FreeEntry{Index: r.Index, Key: r.Key}
	for i := range jobs {
		if jobs[i].server == r.Server && jobs[i].instance == r.Instance {
			jobs[i].entries = append(jobs[i].entries, e)
			return jobs
		}
	}
	return append(jobs, freeJob{server: r.Server, instance: r.Instance, entries: []pool.FreeEntry{e}})
}

// runFrees asks servers to free slabs, in parallel. Confirmed indexes become
// free; failed jobs are kept for Tick to retry. Jobs for servers that are
// not up wait in pending for them too.
func (c *Coordinator) runFrees(ctx context.Context, jobs []freeJob) {
	if len(jobs) == 0 {
		return
	}
	// Cleanup must not stop because the client whose request caused it
	// went away.
	ctx = context.WithoutCancel(ctx)
	errs := make([]error, len(jobs))
	conns := make([]SlabServer, len(jobs))
	c.mu.Lock()
	for i, j := range jobs {
		s := c.servers[j.server]
		switch {
		case s == nil || s.rec.Instance != j.instance:
			errs[i] = errMoot
		case s.rec.State != pool.ServerUp:
			errs[i] = pool.ErrServerDead
		default:
			conns[i], errs[i] = c.connLocked(s)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for i, j := range jobs {
		if errs[i] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
			defer cancel()
			errs[i] = conns[i].Free(cctx, j.instance, j.entries)
		}()
	}
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, j := range jobs {
		s := c.servers[j.server]
		if errs[i] == errMoot || s == nil || s.rec.Instance != j.instance {
			continue // nothing to release: the instance's used map was rebuilt
		}
		if errs[i] != nil {
			if errs[i] != pool.ErrServerDead {
				c.freeFailedLocked(s, len(j.entries), errs[i])
			}
			c.pending = append(c.pending, j)
			continue
		}
		if s.freeFails > 0 {
			c.log.Info("frees succeed again", zap.String("server", string(j.server)), zap.Int("failed_attempts", s.freeFails),
				zap.Duration("after", c.clock.Now().Sub(s.freeFailSince)))
			s.freeFails, s.freeFailSince, s.freeFailSaid = 0, time.Time{}, time.Time{}
		}
		for _, e := range j.entries {
			s.releaseLocked(e.Index)
		}
	}
}

// freeLater runs jobs in a goroutine Close waits for, so that the request
// that caused them does not wait on the servers, and returns a channel
// closed when they are done. A failed job goes to pending as in runFrees.
// Once Close has begun (a request still in flight as the coordinator
// stops) the jobs are dropped, as pending ones are: the next coordinator
// loads the slabs from the store, and a server zeroes and re-keys an index
// it still holds when the index is granted again.
func (c *Coordinator) freeLater(ctx context.Context, jobs []freeJob) <-chan struct{} {
	done := make(chan struct{})
	if len(jobs) == 0 {
		close(done)
		return done
	}
	ctx = context.WithoutCancel(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		close(done)
		return done
	}
	c.bg.Add(1) // under mu, before Close's Wait: see Close
	go func() {
		defer c.bg.Done()
		defer close(done)
		c.runFrees(ctx, jobs)
	}()
	return done
}

// freeWait bounds how long a request that frees slabs (FreeSlab,
// DeleteLease, a failed Allocate or Replace) waits for the servers.
const freeWait = time.Second

// freeSoon runs jobs behind the request (freeLater) and waits for them up
// to freeWait: in the common case the request answers once the servers
// have freed (their room can be allocated again at once), and a server
// that stopped answering, but is not dead yet, holds it for freeWait
// rather than for CallTimeout (10s), with the agent's other requests
// waiting behind it (as Migrated's free held TestEtcdChaosServerPaused's).
func (c *Coordinator) freeSoon(ctx context.Context, jobs []freeJob) {
	done := c.freeLater(ctx, jobs)
	t := time.NewTimer(freeWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// freeFailEvery bounds how often failing frees to one server are logged
// (Tick retries them every sweep).
const freeFailEvery = time.Minute

// freeFailedLocked logs a failed free to s: the first failure, then at most
// once per freeFailEvery while they go on.
func (c *Coordinator) freeFailedLocked(s *srv, slabs int, err error) {
	now := c.clock.Now()
	s.freeFails++
	switch {
	case s.freeFails == 1:
		s.freeFailSince, s.freeFailSaid = now, now
		c.log.Warn("free failed, will retry every sweep", zap.String("server", string(s.rec.ID)), zap.Int("slabs", slabs), zap.Error(err))
	case now.Sub(s.freeFailSaid) >= freeFailEvery:
		s.freeFailSaid = now
		c.log.Warn("frees still failing, retrying", zap.String("server", string(s.rec.ID)), zap.Int("slabs", slabs),
			zap.Int("failed_attempts", s.freeFails), zap.Duration("since", now.Sub(s.freeFailSince)), zap.Error(err))
	}
}

var errMoot = fmt.Errorf("coord: free for a server instance that is gone")

// connLocked returns (dialling if needed) the server's SlabServer.
func (c *Coordinator) connLocked(s *srv) (SlabServer, error) {
	if s.conn == nil {
		conn, err := c.opts.Dialer.SlabServer(&s.rec.ServerInfo)
		if err != nil {
			return nil, fmt.Errorf("coord: dial server %s: %w", s.rec.ID, err)
		}
		s.conn = conn
	}
	return s.conn, nil
}

// stalled reports whether a sweep at now, run every every (0: by hand,
// no pace to keep), the last at last, comes after a stall of the sweeper
// itself: later than its pace by half the heartbeat timeout.
func stalled(last, now time.Time, every, timeout time.Duration) bool {
	return every > 0 && !last.IsZero() && now.Sub(last) > every+timeout/2
}

// resumeLocked forgives, at now, what a stall of this process kept it
// from hearing: when the sweeper's last run (or the last resume) is later
// than its pace by half the heartbeat timeout, this process stood still (a
// loaded machine, a long GC or fsync; stalled). Then heartbeats missed
// meanwhile are not counted (the servers get a whole timeout from now) and
// every lease gets a whole TTL from now, as after a restart (load): the
// renewals that could not get in did not make their agents dead. Tick calls
// it, and so does every request about a lease, which can come in before
// the sweeper runs again.
func (c *Coordinator) resumeLocked(now time.Time) {
	last := c.lastTick
	if c.resumed.After(last) {
		last = c.resumed
	}
	if !stalled(last, now, c.sweepEvery, c.opts.HeartbeatTimeout) {
		return
	}
	c.resumed = now
	for _, l := range c.leases {
		l.extendFrom(now)
	}
	c.log.Warn("the coordinator stalled: heartbeats and lease renewals missed meanwhile are not counted",
		zap.Duration("stall", now.Sub(last)), zap.Int("leases", len(c.leases)))
}

// Tick does the periodic work: marks servers that missed their heartbeats
// dead, ends expired leases (freeing their slabs), and retries frees that
// failed; the frees run behind it (freeLater). RoutineSweep calls it; tests
// with a fake clock call it directly.
func (c *Coordinator) Tick(ctx context.Context) {
	if c.Leading() != nil {
		return // a deposed leader decides nothing: its successor sweeps
	}
	now := c.clock.Now()
	c.mu.Lock()
	c.resumeLocked(now)
	c.lastTick = now
	live := make([]pool.Liveness, 0, len(c.servers))
	for _, s := range c.servers {
		hb := s.lastHB
		if hb.Before(c.resumed) {
			hb = c.resumed
		}
		live = append(live, pool.Liveness{ID: s.rec.ID, State: s.rec.State, LastHeartbeat: hb})
	}
	for _, id := range pool.Dead(live, now, c.opts.HeartbeatTimeout) {
		s := c.servers[id]
		rec := s.rec
		rec.State = pool.ServerDead
		if err := c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Servers, string(id), &rec) }); err != nil {
			c.log.Error("marking server dead", zap.String("server", string(id)), zap.Error(err))
			continue
		}
		s.rec = rec
		c.m.serversDead.Add(1)
		c.log.Warn("server dead: missed heartbeats", zap.String("server", string(id)), zap.Duration("since", now.Sub(s.lastHB)))
	}
	recs := make([]pool.Lease, 0, len(c.leases))
	for _, l := range c.leases {
		recs = append(recs, l.rec)
	}
	var expired []*lease
	for _, id := range pool.Expired(recs, now) {
		expired = append(expired, c.leases[id])
	}
	var jobs []freeJob
	if len(expired) > 0 {
		var err error
		if jobs, err = c.dropLeasesLocked(expired); err != nil {
			c.log.Error("ending expired leases", zap.Error(err))
		} else {
			c.m.leaseExpiries.Add(float64(len(expired)))
		}
	}
	retry := c.pending[:0:0]
	kept := c.pending[:0]
	for _, j := range c.pending {
		if s := c.servers[j.server]; s != nil && s.rec.State == pool.ServerUp && s.rec.Instance == j.instance {
			retry = append(retry, j)
		} else if s != nil && s.rec.Instance == j.instance {
			kept = append(kept, j) // wait for the server to come back
		}
	}
	c.pending = kept
	c.mu.Unlock()
	// Behind the sweep: a free to a server that stopped answering but is
	// not dead yet waits out CallTimeout, and the next sweeps must still
	// find the dead servers and the expired leases meanwhile.
	c.freeLater(ctx, append(jobs, retry...))
}
