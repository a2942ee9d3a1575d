package coord

import (
	"sort"
	"time"

	"rmem/pool"
)

// Replica states in the views.
const (
	replicaOK       = "ok"
	replicaLost     = "lost"
	replicaDraining = "draining"
	replicaUnknown  = "unknown" // on a server not heard from since the coordinator started
)

func (c *Coordinator) replicaStateLocked(r *pool.Replica) string {
	s := c.servers[r.Server]
	var rec *pool.Server
	if s != nil {
		rec = &s.rec
	}
	switch lost, draining := pool.ReplicaHealth(r, rec); {
	case lost:
		return replicaLost
	case !s.heard:
		return replicaUnknown
	case draining:
		return replicaDraining
	}
	return replicaOK
}

func (c *Coordinator) replicaViewLocked(r *pool.Replica) pool.ReplicaView {
	v := pool.ReplicaView{Server: r.Server, Index: r.Index, Key: r.Key, Length: c.opts.SlabSize, State: c.replicaStateLocked(r), Shard: r.Shard}
	if s := c.getSrvLocked(r.Server); s != nil {
		v.Addrs = s.Addrs
	}
	return v
}

func (c *Coordinator) slabViewLocked(sl *pool.Slab, l *lease) pool.SlabView {
	v := pool.SlabView{ID: sl.ID, Lease: sl.Lease, Size: sl.Size, Layout: sl.Layout, Group: sl.Group, Part: sl.Part, Created: sl.Created, Replicas: make([]pool.ReplicaView, len(sl.Replicas))}
	if l != nil {
		v.Agent = l.rec.Agent
	}
	for i := range sl.Replicas {
		v.Replicas[i] = c.replicaViewLocked(&sl.Replicas[i])
	}
	return v
}

func (c *Coordinator) serverViewLocked(s *srv) pool.ServerView {
	now := c.clock.Now()
	v := pool.ServerView{
		Server: s.rec, UsedSlabs: s.nused, FreeSlabs: s.free(),
		Capacity: s.rec.Capacity(), Used: uint64(s.nused) * s.rec.SlabSize,
		LastHeartbeat: s.lastHB, HeartbeatAge: pool.Duration(now.Sub(s.lastHB)),
		Granted: s.hb.Granted, Load: s.hb.Load,
	}
	v.ControlSecret = "" // the coordinator's alone
	if !s.heard {
		// Not heard from since the state was loaded: no heartbeat to
		// show, and no telling whether it is up.
		v.LastHeartbeat, v.HeartbeatAge = time.Time{}, 0
		if s.rec.State == pool.ServerUp {
			v.State = pool.ServerUnknown
		}
	}
	return v
}

// Servers lists the servers, sorted by id.
func (c *Coordinator) Servers() []pool.ServerView {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]pool.ServerView, 0, len(c.servers))
	for _, s := range c.servers {
		out = append(out, c.serverViewLocked(s))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Server returns one server.
func (c *Coordinator) Server(id pool.ServerID) (pool.ServerView, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[id]
	if s == nil {
		return pool.ServerView{}, notFound("server", string(id))
	}
	return c.serverViewLocked(s), nil
}

func (c *Coordinator) leaseViewLocked(l *lease) pool.LeaseView {
	v := pool.LeaseView{Lease: l.rec, Slabs: len(l.slabs), Used: l.report.Used, NoRoom: l.report.NoRoom, Steering: l.report.Steering}
	for _, sl := range l.slabs {
		v.Replicas += len(sl.Replicas)
		v.Bytes += sl.Size
	}
	return v
}

// Leases lists the leases (agents), sorted by agent then id.
func (c *Coordinator) Leases() []pool.LeaseView {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]pool.LeaseView, 0, len(c.leases))
	for _, l := range c.leases {
		out = append(out, c.leaseViewLocked(l))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Agent != out[j].Agent {
			return out[i].Agent < out[j].Agent
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Lease returns one lease.
func (c *Coordinator) Lease(id pool.LeaseID) (pool.LeaseView, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leases[id]
	if l == nil {
		return pool.LeaseView{}, notFound("lease", string(id))
	}
	return c.leaseViewLocked(l), nil
}

// SlabFilter selects slabs; zero fields match everything.
type SlabFilter struct {
	Server pool.ServerID // slabs with a replica on this server
	Lease  pool.LeaseID
	Agent  string // slabs of leases of this agent
}

// Slabs lists the slabs matching f, sorted by id.
func (c *Coordinator) Slabs(f SlabFilter) []pool.SlabView {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []pool.SlabView{}
	for _, sl := range c.slabs {
		l := c.leases[sl.Lease]
		if (f.Server != "" && !sl.HasServer(f.Server)) || (f.Lease != "" && sl.Lease != f.Lease) || (f.Agent != "" && (l == nil || l.rec.Agent != f.Agent)) {
			continue
		}
		out = append(out, c.slabViewLocked(sl, l))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Status summarises the pool.
func (c *Coordinator) Status() pool.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := pool.Status{SlabSize: c.opts.SlabSize, Agents: len(c.leases), Slabs: len(c.slabs), Redundancy: c.opts.Redundancy}
	domains := map[string]bool{}
	for _, l := range c.leases {
		if l.report.NoRoom {
			st.AgentsNoRoom++
		}
	}
	for _, s := range c.servers {
		switch {
		case s.rec.State != pool.ServerUp:
			st.ServersDown++
			continue
		case !s.heard:
			st.ServersUnknown++ // its capacity counts: placement uses it
		default:
			st.ServersUp++
			d := s.rec.Domain
			if d == "" {
				d = "server " + string(s.rec.ID)
			}
			domains[d] = true
		}
		if s.rec.Draining {
			st.ServersDrain++
		}
		st.Capacity += s.rec.Capacity()
		st.Used += uint64(s.nused) * s.rec.SlabSize
	}
	st.Free = st.Capacity - st.Used
	st.Domains = len(domains)
	for _, sl := range c.slabs {
		ok, lost, unknown := c.replicaStatesLocked(sl)
		switch slabHealth(slabNeeds(sl), ok, lost, unknown) {
		case slabHealthy:
			st.SlabsHealthy++
		case slabDegraded:
			st.SlabsDegraded++
		case slabLost:
			st.SlabsLost++
		default:
			st.SlabsUnknown++
		}
	}
	return st
}

// replicaStatesLocked counts sl's replicas that are fine (ok or
// draining), lost, and on servers not heard from.
func (c *Coordinator) replicaStatesLocked(sl *pool.Slab) (ok, lost, unknown int) {
	for i := range sl.Replicas {
		switch c.replicaStateLocked(&sl.Replicas[i]) {
		case replicaLost:
			lost++
		case replicaUnknown:
			unknown++
		default:
			ok++
		}
	}
	return ok, lost, unknown
}

type health int

const (
	slabHealthy  health = iota // every replica fine
	slabDegraded               // some lost, at least one fine
	slabLost                   // every replica lost
	slabUnknown                // it depends on servers not heard from
)

// slabHealth classifies a slab by its replicas' states: a replica on a
// server not heard from counts neither as fine nor as lost.
func slabHealth(need, ok, lost, unknown int) health {
	switch {
	case lost == 0 && unknown == 0:
		return slabHealthy
	case ok >= need && lost > 0:
		return slabDegraded
	case unknown > 0 && ok+unknown >= need:
		return slabUnknown
	}
	return slabLost
}

// slabNeeds is how many of sl's replicas its data needs: K of an
// erasure-coded slab's shards, else one copy.
func slabNeeds(sl *pool.Slab) int {
	if red, err := pool.ParseRedundancy(sl.Layout); err == nil && red.EC() {
		return red.K
	}
	return 1
}
