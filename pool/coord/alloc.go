package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/store"
)

// candidatesLocked lists the servers that may take new replicas.
func (c *Coordinator) candidatesLocked() ([]pool.Candidate, []*srv) {
	c.cands, c.candSrv = c.cands[:0], c.candSrv[:0]
	for _, s := range c.srvList {
		if s.rec.State != pool.ServerUp || s.rec.Draining || s.free() <= 0 {
			continue
		}
		c.cands = append(c.cands, pool.Candidate{ID: s.rec.ID, Domain: s.rec.Domain, Free: s.free()})
		c.candSrv = append(c.candSrv, s)
	}
	return c.cands, c.candSrv
}

// grantJob asks one server instance for keys; keys land in the replicas.
type grantJob struct {
	s        *srv
	id       pool.ServerID // s.rec.ID when reserved: grant reads it without c.mu
	conn     SlabServer
	instance string
	indexes  []pool.SlabIndex
	replicas []*pool.Replica
	err      error
}

// reserveLocked places and reserves the replicas of slabs (whose Replicas
// are appended to) and returns the grant jobs. On error nothing is reserved.
func (c *Coordinator) reserveLocked(slabs []*pool.Slab, replicas int, avoid [][]pool.ServerID) ([]*grantJob, error) {
	cands, srvs := c.candidatesLocked()
	p, err := pool.Place(cands, pool.PlaceRequest{Slabs: len(slabs), Replicas: replicas, Avoid: avoid}, c.rnd)
	if err != nil {
		return nil, err
	}
	byServer := map[*srv]*grantJob{}
	var jobs []*grantJob
	for i, reps := range p {
		sl := slabs[i]
		for _, ci := range reps {
			s := srvs[ci]
			idx := s.takeLocked()
			sl.Replicas = append(sl.Replicas, pool.Replica{Server: s.rec.ID, Index: idx, Instance: s.rec.Instance})
			j := byServer[s]
			if j == nil {
				j = &grantJob{s: s, id: s.rec.ID, instance: s.rec.Instance}
				byServer[s] = j
				jobs = append(jobs, j)
			}
			j.indexes = append(j.indexes, idx)
		}
	}
	// Pointers into Replicas are taken once the slices stop growing.
	for _, sl := range slabs {
		for k := len(sl.Replicas) - replicas; k < len(sl.Replicas); k++ {
			r := &sl.Replicas[k]
			for _, j := range jobs {
				if j.s.rec.ID == r.Server {
					j.replicas = append(j.replicas, r)
					break
				}
			}
		}
	}
	for _, j := range jobs {
		if j.conn, j.err = c.connLocked(j.s); j.err != nil {
			c.releaseJobsLocked(jobs)
			return nil, fmt.Errorf("%w: %w", pool.ErrGrantFailed, j.err)
		}
	}
	return jobs, nil
}

func (c *Coordinator) releaseJobsLocked(jobs []*grantJob) {
	for _, j := range jobs {
		if j.s.rec.Instance != j.instance {
			continue
		}
		for _, idx := range j.indexes {
			j.s.releaseLocked(idx)
		}
	}
}

// grant runs the jobs in parallel, without c.mu.
func (c *Coordinator) grant(ctx context.Context, jobs []*grantJob) error {
	if err := c.Leading(); err != nil {
		// Deposed since the reservation: grant nothing (a grant revokes
		// whatever key the slab had, perhaps the new leader's).
		for _, j := range jobs {
			j.err = err
		}
		return err
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
			defer cancel()
			keys, err := j.conn.Grant(cctx, j.instance, c.epoch(), j.indexes)
			if err == nil && len(keys) != len(j.indexes) {
				err = fmt.Errorf("server returned %d keys for %d slabs", len(keys), len(j.indexes))
			}
			if err != nil {
				j.err = fmt.Errorf("server %s: %w", j.id, err)
				return
			}
			for i, r := range j.replicas {
				r.Key = keys[i]
			}
		}()
	}
	wg.Wait()
	var errs []error
	for _, j := range jobs {
		if j.err != nil {
			errs = append(errs, j.err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", pool.ErrGrantFailed, errors.Join(errs...))
	}
	return nil
}

// abortLocked undoes a reservation after a failed grant or commit: slabs a
// server granted are freed through it (their indexes stay used until it
// confirms), the others are released now.
func (c *Coordinator) abortLocked(jobs []*grantJob) []freeJob {
	var frees []freeJob
	for _, j := range jobs {
		if j.err != nil || j.s.rec.Instance != j.instance {
			for _, idx := range j.indexes {
				if j.s.rec.Instance == j.instance {
					j.s.releaseLocked(idx)
				}
			}
			continue
		}
		fj := freeJob{server: j.s.rec.ID, instance: j.instance}
		for i, idx := range j.indexes {
			fj.entries = append(fj.entries, pool.FreeEntry{Index: idx, Key: j.replicas[i].Key})
		}
		frees = append(frees, fj)
	}
	return frees
}

// checkCommitLocked verifies that what was reserved is still valid after
// the grant: the lease is live and every server is the same instance.
func (c *Coordinator) checkCommitLocked(id pool.LeaseID, jobs []*grantJob, now time.Time) (*lease, error) {
	l, err := c.liveLeaseLocked(id, now)
	if err != nil {
		return nil, err
	}
	for _, j := range jobs {
		if j.s.rec.Instance != j.instance || c.servers[j.s.rec.ID] != j.s {
			return nil, fmt.Errorf("%w: server %s restarted during the allocation", pool.ErrStaleInstance, j.s.rec.ID)
		}
	}
	return l, nil
}

// Allocate places req.Slabs new slabs of req.Replicas replicas each for
// lease id, has the servers grant keys, and records them. All or nothing:
// on error no slab is allocated and every reservation is undone.
func (c *Coordinator) Allocate(ctx context.Context, id pool.LeaseID, req pool.AllocateRequest) ([]pool.SlabView, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	views, failed, err := c.allocate(ctx, id, req, nil)
	if len(failed) > 0 && !errors.Is(err, pool.ErrNotLeader) {
		// A server that failed to grant (dead but not yet past the
		// heartbeat timeout, or unreachable from here) gets no part of a
		// second try (nor, where labelled, its failure domain); if that
		// cannot be placed, the grant failure is the error worth reporting.
		c.log.Info("retrying an allocation without the servers that failed to grant", zap.Any("servers", failed), zap.Error(err))
		avoid := make([][]pool.ServerID, req.Slabs)
		for i := range avoid {
			avoid[i] = failed
		}
		if v, _, rerr := c.allocate(ctx, id, req, avoid); rerr == nil {
			views, err = v, nil
		}
	}
	if err != nil {
		c.m.allocFailures.Add(1)
		return nil, err
	}
	c.m.slabsAllocated.Add(float64(len(views)))
	return views, nil
}

// allocate is one attempt of Allocate, placing no replica on the servers
// of avoid (per slab). It also returns the servers whose grant failed.
func (c *Coordinator) allocate(ctx context.Context, id pool.LeaseID, req pool.AllocateRequest, avoid [][]pool.ServerID) ([]pool.SlabView, []pool.ServerID, error) {
	now := c.clock.Now()
	c.mu.Lock()
	if _, err := c.liveLeaseLocked(id, now); err != nil {
		c.mu.Unlock()
		return nil, nil, err
	}
	slabs := make([]*pool.Slab, req.Slabs)
	for i := range slabs {
		slabs[i] = &pool.Slab{ID: c.nextSlab, Lease: id, Size: c.opts.SlabSize, Layout: req.Layout, Created: now, Replicas: make([]pool.Replica, 0, req.Replicas)}
		c.nextSlab++
	}
	jobs, err := c.reserveLocked(slabs, req.Replicas, avoid)
	c.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	if k, ok := pool.StripeLayout(req.Layout); ok { // each K slabs a unit
		for i, sl := range slabs {
			sl.Group, sl.Part = slabs[i-i%k].ID, i%k
		}
	} else if req.Layout != "" { // each replica a shard, in the order placed
		for _, sl := range slabs {
			for i := range sl.Replicas {
				sl.Replicas[i].Shard = i
			}
		}
	}

	err = c.grant(ctx, jobs)
	var failed []pool.ServerID
	for _, j := range jobs {
		if j.err != nil {
			failed = append(failed, j.id)
		}
	}

	c.mu.Lock()
	var l *lease
	if err == nil {
		l, err = c.checkCommitLocked(id, jobs, c.clock.Now())
	}
	if err == nil {
		err = c.opts.Store.Update(func(tx store.Tx) error {
			for _, sl := range slabs {
				if err := put(tx, store.Slabs, slabKey(sl.ID), sl); err != nil {
					return err
				}
			}
			return putNextSlab(tx, c.nextSlab)
		})
		if err != nil {
			err = fmt.Errorf("coord: allocate: %w", err)
		}
	}
	if err != nil {
		frees := c.abortLocked(jobs)
		c.mu.Unlock()
		c.freeSoon(ctx, frees)
		return nil, failed, err
	}
	views := make([]pool.SlabView, len(slabs))
	for i, sl := range slabs {
		l.slabs[sl.ID] = sl
		c.slabs[sl.ID] = sl
		views[i] = c.slabViewLocked(sl, l)
	}
	c.mu.Unlock()
	c.log.Debug("allocated", zap.String("lease", string(id)), zap.Int("slabs", req.Slabs), zap.Int("replicas", req.Replicas))
	return views, nil, nil
}

// crowded returns from and the servers that hold two shards of sl: where
// a shard's replacement must not go.
func crowded(sl *pool.Slab, from pool.ServerID) []pool.ServerID {
	n := map[pool.ServerID]int{}
	out := []pool.ServerID{from}
	for _, r := range sl.Replicas {
		if n[r.Server]++; n[r.Server] == 2 && r.Server != from {
			out = append(out, r.Server)
		}
	}
	return out
}

// Replace places one new replica of slab sid, to take over from the replica
// on server from, on a server that holds none of the slab's replicas. The
// new replica is recorded at once (the agent writes to it while copying);
// the old one stays until Migrated.
func (c *Coordinator) Replace(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) (pool.ReplicaView, error) {
	now := c.clock.Now()
	c.mu.Lock()
	_, sl, err := c.slabOfLocked(id, sid, now)
	if err != nil {
		c.mu.Unlock()
		return pool.ReplicaView{}, err
	}
	if !sl.HasServer(from) {
		c.mu.Unlock()
		return pool.ReplicaView{}, &pool.FieldError{Field: "server", Msg: fmt.Sprintf("slab %d has no replica on server %q", sid, from)}
	}
	if len(sl.Replicas) >= 2*pool.MaxReplicas {
		c.mu.Unlock()
		return pool.ReplicaView{}, fmt.Errorf("%w: slab %d already has %d replicas: report migrations done first", pool.ErrConflict, sid, len(sl.Replicas))
	}
	avoid := make([]pool.ServerID, 0, len(sl.Replicas))
	shard := 0 // the replacement takes the shard of the replica it replaces
	for _, r := range sl.Replicas {
		avoid = append(avoid, r.Server)
		if r.Server == from {
			shard = r.Shard
		}
	}
	tmp := &pool.Slab{ID: sid, Replicas: make([]pool.Replica, 0, 1)}
	jobs, err := c.reserveLocked([]*pool.Slab{tmp}, 1, [][]pool.ServerID{avoid})
	if errors.Is(err, pool.ErrNoCapacity) && slabNeeds(sl) > 1 {
		// An erasure-coded slab with a shard on every server left: a
		// second shard on one of them beats a shard not rebuilt (the
		// stripes lose two pages at most with that server, and its
		// parity covers two), never a third.
		tmp.Replicas = tmp.Replicas[:0]
		jobs, err = c.reserveLocked([]*pool.Slab{tmp}, 1, [][]pool.ServerID{crowded(sl, from)})
	}
	c.mu.Unlock()
	if err != nil {
		return pool.ReplicaView{}, err
	}

	err = c.grant(ctx, jobs)

	c.mu.Lock()
	var l *lease
	if err == nil {
		l, err = c.checkCommitLocked(id, jobs, c.clock.Now())
	}
	var next pool.Slab
	if err == nil {
		if sl = l.slabs[sid]; sl == nil {
			err = fmt.Errorf("%w: slab %d was freed during the replacement", pool.ErrNotFound, sid)
		}
	}
	if err == nil {
		next = *sl
		tmp.Replicas[0].Shard = shard
		next.Replicas = append(append([]pool.Replica(nil), sl.Replicas...), tmp.Replicas[0])
		if err = c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Slabs, slabKey(sid), &next) }); err != nil {
			err = fmt.Errorf("coord: replace: %w", err)
		}
	}
	if err != nil {
		frees := c.abortLocked(jobs)
		c.mu.Unlock()
		c.freeSoon(ctx, frees)
		return pool.ReplicaView{}, err
	}
	sl.Replicas = next.Replicas
	v := c.replicaViewLocked(&sl.Replicas[len(sl.Replicas)-1])
	c.mu.Unlock()
	c.m.replacements.Add(1)
	c.log.Info("replica replacement placed", zap.Uint64("slab", uint64(sid)), zap.String("from", string(from)), zap.String("to", string(v.Server)))
	return v, nil
}
