package pool

import (
	"sort"
	"time"
)

// Expired returns the ids of the leases that have expired at now (Expires
// is not after now), sorted.
func Expired(leases []Lease, now time.Time) []LeaseID {
	var out []LeaseID
	for i := range leases {
		if !leases[i].Expires.After(now) {
			out = append(out, leases[i].ID)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Liveness is what the coordinator knows about a server's heartbeats. It is
// not stored: after a restart the coordinator gives every server a full
// timeout from its start to heartbeat again.
type Liveness struct {
	ID            ServerID
	State         ServerState
	LastHeartbeat time.Time
}

// Dead returns the servers that are up but whose last heartbeat is older
// than timeout at now, sorted.
func Dead(servers []Liveness, now time.Time, timeout time.Duration) []ServerID {
	var out []ServerID
	for _, s := range servers {
		if s.State == ServerUp && now.Sub(s.LastHeartbeat) > timeout {
			out = append(out, s.ID)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// EventType says what an agent must do about one of its replicas.
type EventType string

const (
	// EventReplicaLost: the replica's server is dead, has left, or has
	// restarted (its memory is gone). Restore redundancy from a surviving
	// replica (ask for a replacement, copy, report the migration done) or
	// free the slab.
	EventReplicaLost EventType = "replica-lost"
	// EventReplicaDrain: the replica's server is draining. Ask for a
	// replacement, copy the data, report the migration done.
	EventReplicaDrain EventType = "replica-drain"
)

// Event tells an agent about one replica of one of its slabs. Events are
// computed from the current state on every renewal, so they repeat until the
// agent has acted on them.
type Event struct {
	Type   EventType `json:"type"`
	Slab   SlabID    `json:"slab"`
	Server ServerID  `json:"server"`
	Index  SlabIndex `json:"index"`
}

// ReplicaHealth classifies r given its server's record (nil if unknown).
func ReplicaHealth(r *Replica, srv *Server) (lost, draining bool) {
	if srv == nil || srv.State != ServerUp || srv.Instance != r.Instance {
		return true, false
	}
	return false, srv.Draining
}

// EventsFor returns the events for slabs, in slab then replica order,
// appended to out. server looks up a server's record (nil if unknown).
func EventsFor(out []Event, slabs []*Slab, server func(ServerID) *Server) []Event {
	for _, s := range slabs {
		for i := range s.Replicas {
			r := &s.Replicas[i]
			lost, draining := ReplicaHealth(r, server(r.Server))
			switch {
			case lost:
				out = append(out, Event{Type: EventReplicaLost, Slab: s.ID, Server: r.Server, Index: r.Index})
			case draining:
				out = append(out, Event{Type: EventReplicaDrain, Slab: s.ID, Server: r.Server, Index: r.Index})
			}
		}
	}
	return out
}
