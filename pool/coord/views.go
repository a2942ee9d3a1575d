package coord

import (
	"sort"

	"rmem/pool"
)

func (c *Coordinator) replicaViewLocked(r *pool.Replica) pool.ReplicaView {
	s := c.getSrvLocked(r.Server)
	v := pool.ReplicaView{Server: r.Server, Index: r.Index, Key: r.Key, Length: c.opts.SlabSize, State: "ok"}
	if s != nil {
		v.Addrs = s.Addrs
	}
	switch lost, draining := pool.ReplicaHealth(r, s); {
	case lost:
		v.State = "lost"
	case draining:
		v.State = "draining"
	}
	return v
}

func (c *Coordinator) slabViewLocked(sl *pool.Slab, l *lease) pool.SlabView {
	v := pool.SlabView{ID: sl.ID, Lease: sl.Lease, Size: sl.Size, Created: sl.Created, Replicas: make([]pool.ReplicaView, len(sl.Replicas))}
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
	return pool.ServerView{
		Server: s.rec, UsedSlabs: s.nused, FreeSlabs: s.free(),
		Capacity: s.rec.Capacity(), Used: uint64(s.nused) * s.rec.SlabSize,
		LastHeartbeat: s.lastHB, HeartbeatAge: pool.Duration(now.Sub(s.lastHB)),
		Granted: s.hb.Granted, Load: s.hb.Load,
	}
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
	v := pool.LeaseView{Lease: l.rec, Slabs: len(l.slabs), Used: l.report.Used, NoRoom: l.report.NoRoom}
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
	st := pool.Status{SlabSize: c.opts.SlabSize, Agents: len(c.leases), Slabs: len(c.slabs)}
	for _, l := range c.leases {
		if l.report.NoRoom {
			st.AgentsNoRoom++
		}
	}
	for _, s := range c.servers {
		if s.rec.State != pool.ServerUp {
			st.ServersDown++
			continue
		}
		st.ServersUp++
		if s.rec.Draining {
			st.ServersDrain++
		}
		st.Capacity += s.rec.Capacity()
		st.Used += uint64(s.nused) * s.rec.SlabSize
	}
	st.Free = st.Capacity - st.Used
	for _, sl := range c.slabs {
		ok := 0
		for i := range sl.Replicas {
			if lost, _ := pool.ReplicaHealth(&sl.Replicas[i], c.getSrvLocked(sl.Replicas[i].Server)); !lost {
				ok++
			}
		}
		switch {
		case ok == len(sl.Replicas):
			st.SlabsHealthy++
		case ok > 0:
			st.SlabsDegraded++
		default:
			st.SlabsLost++
		}
	}
	return st
}
