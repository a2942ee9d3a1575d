package coord

import (
	"fmt"
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
func (c *Coordinator) Register(info pool.ServerInfo) (pool.Server, error) {
	if err := info.Validate(); err != nil {
		return pool.Server{}, err
	}
	if info.SlabSize != c.opts.SlabSize {
		return pool.Server{}, &pool.FieldError{Field: "slab_size", Msg: fmt.Sprintf("the pool's slab size is %d bytes, the server's %d (set the same --slab-size everywhere)", c.opts.SlabSize, info.SlabSize)}
	}
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.servers[info.ID]
	rec := pool.Server{ServerInfo: info, State: pool.ServerUp, Registered: now}
	if old != nil {
		if old.rec.Instance != info.Instance && old.rec.State == pool.ServerUp && now.Sub(old.lastHB) <= c.opts.HeartbeatTimeout {
			// Either two nodes share an id, or the server restarted faster
			// than the timeout: refuse until the old instance is declared
			// dead, rather than let one node wipe the other's replicas.
			return pool.Server{}, fmt.Errorf("%w: server id %q is held by live instance %s (last heartbeat %v ago): is another node using the same --id? A restarted server is accepted once the old instance misses its heartbeats (%v)",
				pool.ErrConflict, info.ID, old.rec.Instance, now.Sub(old.lastHB).Round(time.Millisecond), c.opts.HeartbeatTimeout)
		}
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
	s.rec, s.lastHB, s.conn = rec, now, nil
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
	s.lastHB, s.hb = now, hb
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
	return pool.DrainView{Server: id, Draining: s.rec.Draining, Replicas: n, Done: s.rec.Draining && n == 0}, nil
}

// closeConn releases a SlabServer's idle connections, if it has any.
func closeConn(conn SlabServer) {
	if c, ok := conn.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Close releases the connections to memory servers. The Coordinator must
// not be used afterwards; the caller closes the store.
func (c *Coordinator) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.srvList {
		closeConn(s.conn)
		s.conn = nil
	}
}
