package coord

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"syscall"
	"time"

	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/store"
)

func zapInt(k string, v int) zap.Field { return zap.Int(k, v) }

// Register adds a server or updates its registration. A new Instance means
// the server restarted: replicas of the old instance are lost (agents learn
// it on renewal) and all its slabs are free. A drain survives
// re-registration.
//
// A new instance while the old one still looks live (heartbeats within the
// timeout) is either the same node restarted quickly or a second node using
// the same id. Register asks the old instance's control URL which instance
// answers there: another one (the new process took its address), or no
// process listening, means the old one is gone and the new one joins at
// once; the old instance answering, or no answer, is a conflict
// (pool.ErrConflict) until the old instance misses its heartbeats.
func (c *Coordinator) Register(info pool.ServerInfo) (pool.Server, error) {
	if err := info.Validate(); err != nil {
		return pool.Server{}, err
	}
	if info.SlabSize != c.opts.SlabSize {
		return pool.Server{}, &pool.FieldError{Field: "slab_size", Msg: fmt.Sprintf("the pool's slab size is %d bytes, the server's %d (set the same --slab-size everywhere)", c.opts.SlabSize, info.SlabSize)}
	}
	gone := "" // an old instance found gone by probing
	for probed := false; ; probed = true {
		c.mu.Lock()
		old := c.servers[info.ID]
		now := c.clock.Now()
		if old == nil || old.rec.Instance == info.Instance || old.rec.Instance == gone || !c.liveLocked(old, now) {
			rec, err := c.registerLocked(info, old, now)
			c.mu.Unlock()
			return rec, err
		}
		oldInfo, age := old.rec.ServerInfo, now.Sub(old.lastHB)
		c.mu.Unlock()
		if !probed {
			if why, ok := c.instanceGone(oldInfo); ok {
				c.log.Info("server restarted: its old instance is gone", zap.String("server", string(info.ID)),
					zap.String("old_instance", oldInfo.Instance), zap.String("instance", info.Instance), zap.String("because", why))
				gone = oldInfo.Instance
				continue
			}
		}
		// Either two nodes share an id, or the old instance could not be
		// asked: refuse until it is declared dead, rather than let one node
		// wipe the other's replicas.
		return pool.Server{}, fmt.Errorf("%w: server id %q is held by live instance %s (last heartbeat %v ago, and it still answers at %s or cannot be asked): is another node using the same --id? A restarted server is accepted once the old instance misses its heartbeats (%v)",
			pool.ErrConflict, info.ID, oldInfo.Instance, age.Round(time.Millisecond), orNone(oldInfo.ControlURL), c.opts.HeartbeatTimeout)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(no control URL)"
	}
	return s
}

// liveLocked reports whether s's instance looks alive: up and heartbeating
// within the timeout.
func (c *Coordinator) liveLocked(s *srv, now time.Time) bool {
	return s.rec.State == pool.ServerUp && now.Sub(s.lastHB) <= c.opts.HeartbeatTimeout
}

// probeTimeout bounds Register's question to an old instance.
const probeTimeout = 2 * time.Second

// instanceGone asks the server registered as old which instance answers at
// its control URL, and reports whether old's instance is gone (and why).
func (c *Coordinator) instanceGone(old pool.ServerInfo) (string, bool) {
	if old.ControlURL == "" {
		return "", false
	}
	conn, err := c.opts.Dialer.SlabServer(&old)
	if err != nil {
		return "", false
	}
	defer closeConn(conn)
	p, ok := conn.(InstanceProber)
	if !ok {
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	inst, err := p.ProbeInstance(ctx)
	switch {
	case err == nil && inst != old.Instance:
		return fmt.Sprintf("instance %s answers at %s", inst, old.ControlURL), true
	case err == nil:
		return "", false
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("nothing listens at %s", old.ControlURL), true
	}
	return "", false
}

// registerLocked records info, replacing old (nil: a new server).
func (c *Coordinator) registerLocked(info pool.ServerInfo, old *srv, now time.Time) (pool.Server, error) {
	rec := pool.Server{ServerInfo: info, State: pool.ServerUp, Registered: now}
	if old != nil {
		rec.Draining = old.rec.Draining
		if old.rec.Instance == info.Instance && old.rec.Slabs != info.Slabs {
			return pool.Server{}, fmt.Errorf("%w: server %q instance %s re-registered with %d slabs, had %d", pool.ErrConflict, info.ID, info.Instance, info.Slabs, old.rec.Slabs)
		}
	}
	if err := c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Servers, string(info.ID), &rec) }); err != nil {
		return pool.Server{}, fmt.Errorf("coord: register %s: %w", info.ID, err)
	}
	s := old
	if s == nil {
		s = &srv{}
		c.servers[info.ID] = s
		c.srvList = append(c.srvList, s)
	}
	restarted := old == nil || old.rec.Instance != info.Instance
	closeConn(s.conn)
	s.rec, s.lastHB, s.conn, s.heard = rec, now, nil, true
	s.hb = pool.Heartbeat{Instance: info.Instance}
	if restarted {
		// Frees for the old instance are moot: its memory is gone.
		kept := c.pending[:0]
		for _, j := range c.pending {
			if j.server != info.ID {
				kept = append(kept, j)
			}
		}
		c.pending = kept
		c.rebuildUsedLocked(s)
	}
	c.log.Info("server registered", zap.String("server", string(info.ID)), zap.String("instance", info.Instance),
		zap.Int("slabs", info.Slabs), zap.Uint64("slab_size", info.SlabSize), zap.Bool("restarted", restarted))
	return rec, nil
}

// Heartbeat records a server's heartbeat. A dead server that heartbeats
// again (same instance: its memory and keys survived) is up again. A
// heartbeat from another instance, or from a server that left, fails with
// pool.ErrStaleInstance: the server must register again.
func (c *Coordinator) Heartbeat(id pool.ServerID, hb pool.Heartbeat) error {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[id]
	if s == nil {
		return fmt.Errorf("%w: server %q (register first)", pool.ErrNotFound, id)
	}
	if hb.Instance != s.rec.Instance || s.rec.State == pool.ServerLeft {
		return fmt.Errorf("%w: server %q is registered as instance %s (%s), heartbeat from %s: register again", pool.ErrStaleInstance, id, s.rec.Instance, s.rec.State, hb.Instance)
	}
	if s.rec.State == pool.ServerDead {
		rec := s.rec
		rec.State = pool.ServerUp
		if err := c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Servers, string(id), &rec) }); err != nil {
			return fmt.Errorf("coord: heartbeat %s: %w", id, err)
		}
		s.rec = rec
		c.log.Info("server back up", zap.String("server", string(id)))
	}
	if err := c.Leading(); err != nil {
		return err // in memory only: see Renew
	}
	s.lastHB, s.hb, s.heard = now, hb, true
	return nil
}

// Leave marks a server as gone on purpose: its replicas are lost.
func (c *Coordinator) Leave(id pool.ServerID) error {
	return c.updateServer(id, func(rec *pool.Server) { rec.State = pool.ServerLeft })
}

// SetDrain starts (on) or stops draining a server: a draining server gets
// no new replicas and its holders are asked to move theirs.
func (c *Coordinator) SetDrain(id pool.ServerID, on bool) error {
	return c.updateServer(id, func(rec *pool.Server) { rec.Draining = on })
}

func (c *Coordinator) updateServer(id pool.ServerID, change func(*pool.Server)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[id]
	if s == nil {
		return fmt.Errorf("%w: server %q", pool.ErrNotFound, id)
	}
	rec := s.rec
	change(&rec)
	if err := c.opts.Store.Update(func(tx store.Tx) error { return put(tx, store.Servers, string(id), &rec) }); err != nil {
		return fmt.Errorf("coord: update server %s: %w", id, err)
	}
	s.rec = rec
	c.log.Info("server updated", zap.String("server", string(id)), zap.String("state", string(rec.State)), zap.Bool("draining", rec.Draining))
	return nil
}

func (c *Coordinator) replicasOnLocked(id pool.ServerID) int {
	n := 0
	for _, sl := range c.slabs {
		for _, r := range sl.Replicas {
			if r.Server == id {
				n++
			}
		}
	}
	return n
}

// Drain returns a server's drain progress: the replicas still on it.
func (c *Coordinator) Drain(id pool.ServerID) (pool.DrainView, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[id]
	if s == nil {
		return pool.DrainView{}, fmt.Errorf("%w: server %q", pool.ErrNotFound, id)
	}
	n := c.replicasOnLocked(id)
	v := pool.DrainView{Server: id, Draining: s.rec.Draining, Replicas: n, Done: s.rec.Draining && n == 0}
	if s.rec.Draining && n > 0 {
		v.Blocked, v.Reason = c.drainBlockedLocked(id)
	}
	return v, nil
}

// drainBlockedLocked counts the replicas on server id that no server could
// take now, as Replace would place them, and says why for the first.
func (c *Coordinator) drainBlockedLocked(id pool.ServerID) (int, string) {
	cands, _ := c.candidatesLocked()
	cands = append([]pool.Candidate(nil), cands...) // Replace's reserve reuses the slice
	ids := make([]pool.SlabID, 0, len(c.slabs))
	for sid, sl := range c.slabs {
		if sl.HasServer(id) {
			ids = append(ids, sid)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	blocked, reason := 0, ""
	for _, sid := range ids {
		sl := c.slabs[sid]
		avoid := make([]pool.ServerID, 0, len(sl.Replicas))
		for _, r := range sl.Replicas {
			avoid = append(avoid, r.Server)
		}
		if _, err := pool.Place(cands, pool.PlaceRequest{Slabs: 1, Replicas: 1, Avoid: [][]pool.ServerID{avoid}}, c.rnd); err != nil {
			for _, r := range sl.Replicas {
				if r.Server == id {
					blocked++
				}
			}
			if reason == "" {
				reason = fmt.Sprintf("slab %d (replicas on %v) has nowhere to go: %v", sid, avoid, err)
			}
		}
	}
	return blocked, reason
}

// closeConn releases a SlabServer's idle connections, if it has any.
func closeConn(conn SlabServer) {
	if c, ok := conn.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Close waits for the frees started behind requests and sweeps (each
// bounded by CallTimeout; later ones are dropped, see freeLater) and
// releases the connections to memory servers. The Coordinator must not be
// used afterwards; the caller closes the store.
func (c *Coordinator) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.bg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.srvList {
		closeConn(s.conn)
		s.conn = nil
	}
}
