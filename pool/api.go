package pool

import "time"

// JSON types of the control API (docs/api.md). Requests are validated by
// their Validate method, which names the bad field.

// APIError is the body of every error response.
type APIError struct {
	Error string `json:"error"`
	// Field names the request field at fault, for 400 responses.
	Field string `json:"field,omitempty"`
	// Leader is the leader coordinator's URL, when a coordinator that is
	// not the leader answers 503 and knows it.
	Leader string `json:"leader,omitempty"`
}

// ServerView is a server as the API shows it.
type ServerView struct {
	Server
	UsedSlabs     int       `json:"used_slabs"`
	FreeSlabs     int       `json:"free_slabs"`
	Capacity      uint64    `json:"capacity"`
	Used          uint64    `json:"used"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	HeartbeatAge  Duration  `json:"heartbeat_age"`
	Granted       int       `json:"granted"` // as reported by the server
	Load          float64   `json:"load"`
}

// LeaseView is a lease as the API shows it (memd agents).
type LeaseView struct {
	Lease
	Slabs    int    `json:"slabs"`
	Replicas int    `json:"replicas"`
	Bytes    uint64 `json:"bytes"` // logical bytes held (one replica per slab)
	// Used is what the agent last reported holding pages' data (of
	// Bytes), and NoRoom whether it is waiting for room.
	Used   uint64 `json:"used"`
	NoRoom bool   `json:"no_room,omitempty"`
	Steering
}

// ReplicaView is one replica as handed to an agent: everything it needs to
// read and write the replica with rdma.
type ReplicaView struct {
	Server ServerID          `json:"server"`
	Index  SlabIndex         `json:"index"`
	Addrs  map[string]string `json:"addrs"`
	Key    Key               `json:"key,omitempty"` // empty in admin listings
	Length uint64            `json:"length"`
	State  string            `json:"state"` // "ok", "lost", "draining", "unknown" (server not heard from yet)
	// Shard is the replica's place in an erasure-coded slab (Layout):
	// kept by its replacement.
	Shard int `json:"shard,omitempty"`
}

// SlabView is a logical slab as the API shows it.
type SlabView struct {
	ID       SlabID        `json:"id"`
	Lease    LeaseID       `json:"lease"`
	Agent    string        `json:"agent"`
	Size     uint64        `json:"size"`
	Layout   string        `json:"layout,omitempty"` // AllocateRequest.Layout
	Group    SlabID        `json:"group,omitempty"`  // Slab.Group
	Part     int           `json:"part,omitempty"`
	Replicas []ReplicaView `json:"replicas"`
	Created  time.Time     `json:"created"`
}

// Status is the pool summary (memd status).
type Status struct {
	Capacity       uint64 `json:"capacity"`
	Used           uint64 `json:"used"`
	Free           uint64 `json:"free"`
	SlabSize       uint64 `json:"slab_size"`
	ServersUp      int    `json:"servers_up"`
	ServersDown    int    `json:"servers_down"`
	ServersUnknown int    `json:"servers_unknown"` // up in the store, not heard from since this coordinator started
	ServersDrain   int    `json:"servers_draining"`
	Agents         int    `json:"agents"`
	AgentsNoRoom   int    `json:"agents_no_room"` // agents whose programs wait for room
	Slabs          int    `json:"slabs"`
	SlabsHealthy   int    `json:"slabs_healthy"`  // every replica ok
	SlabsDegraded  int    `json:"slabs_degraded"` // some replica lost, at least one ok
	SlabsLost      int    `json:"slabs_lost"`     // no replica ok
	SlabsUnknown   int    `json:"slabs_unknown"`  // none known lost but some on servers not heard from yet, or all lost but those
	// Domains is the failure domains of the servers up (a server without
	// one is a domain of its own): how many servers a slab can spread over.
	Domains int `json:"failure_domains"`
	// Redundancy is the pool's default for agents that choose none
	// (memd serve --redundancy): rep:N or ec:K+M; empty: theirs.
	Redundancy string `json:"redundancy,omitempty"`
	// Coordinators is GET /v1/coordinators, added by memd status.
	Coordinators *Coordinators `json:"coordinators,omitempty"`
}

// CoordinatorView is one coordinator as GET /v1/coordinators shows it.
type CoordinatorView struct {
	ID     string `json:"id"`
	URL    string `json:"url"`
	Leader bool   `json:"leader"`
	// Epoch is its election key's creation revision: the fencing token it
	// leads (or would lead) with.
	Epoch int64 `json:"epoch,omitempty"`
}

// Coordinators is GET /v1/coordinators: the pool's coordinators as the one
// answering sees them. Any coordinator answers it, leader or not.
type Coordinators struct {
	Store        string            `json:"store"`               // "bbolt" or "etcd"
	Endpoints    []string          `json:"endpoints,omitempty"` // etcd's
	Self         string            `json:"self"`                // the one answering
	Leader       *CoordinatorView  `json:"leader,omitempty"`    // none during an election
	Coordinators []CoordinatorView `json:"coordinators"`
	// Error says why the list may be incomplete (etcd did not answer).
	Error string `json:"error,omitempty"`
}

// RegisterRequest is POST /v1/servers.
type RegisterRequest = ServerInfo

// CreateLeaseRequest is POST /v1/leases.
type CreateLeaseRequest struct {
	Agent string   `json:"agent"`
	Node  string   `json:"node"`
	PID   int      `json:"pid"`
	TTL   Duration `json:"ttl"`
}

// AllocateRequest is POST /v1/leases/{id}/slabs.
type AllocateRequest struct {
	Slabs    int `json:"slabs"`
	Replicas int `json:"replicas"`
	// Layout, when set, is how the agent spreads a slab over its
	// replicas, kept with the slab for the agent after it: "ec:K+M" (an
	// erasure-coded slab of K+M shards, Replicas = K+M, each replica a
	// shard named by its ReplicaView.Shard), or "stripe:K" (Slabs is a
	// multiple of K, and each K slabs in turn are one unit: the agent's
	// pages striped over them, each slab with Replicas copies; the views
	// name the unit's first slab as Group and each slab's Part). Empty:
	// replicas are copies of independent slabs.
	Layout string `json:"layout,omitempty"`
}

// AllocateResponse lists the new slabs.
type AllocateResponse struct {
	Slabs []SlabView `json:"slabs"`
}

// RenewRequest is the optional body of POST /v1/leases/{id}/renew: how the
// agent uses what it holds, for memd agents and memd status (an empty body
// reports nothing).
type RenewRequest struct {
	// Used is the bytes of the lease's slabs that hold pages' data (the
	// rest is the agent's free slots).
	Used uint64 `json:"used"`
	// NoRoom: the agent's last allocation found no room, and programs
	// past their budgets wait for it.
	NoRoom bool `json:"no_room,omitempty"`
	Steering
}

// Steering is what an agent reports of its programs whose budgets a
// slowdown target steers (memagent --max-slowdown): how many, the sum of
// their budgets and of their bytes in the pool, and the highest stall
// among them (percent of wall time in misses over the last step).
type Steering struct {
	Steered       int     `json:"steered,omitempty"`
	SteeredBudget uint64  `json:"steered_budget,omitempty"`
	SteeredRemote uint64  `json:"steered_remote,omitempty"`
	MaxStallPct   float64 `json:"max_stall_pct,omitempty"`
}

// RenewResponse is POST /v1/leases/{id}/renew.
type RenewResponse struct {
	Lease  Lease   `json:"lease"`
	Events []Event `json:"events"`
}

// ReplaceRequest is POST /v1/leases/{id}/slabs/{slab}/replace: place one new
// replica of the slab, on a server none of its replicas use, to replace the
// one on Server.
type ReplaceRequest struct {
	Server ServerID `json:"server"`
}

// MigratedRequest is POST /v1/leases/{id}/slabs/{slab}/migrated: the agent
// has copied the slab to its replacement; the replica on Server is freed.
type MigratedRequest struct {
	Server ServerID `json:"server"`
}

// DrainView is GET /v1/servers/{id}/drain: how much is left on a draining server.
type DrainView struct {
	Server   ServerID `json:"server"`
	Draining bool     `json:"draining"`
	Replicas int      `json:"replicas"` // replicas still on the server
	Done     bool     `json:"done"`
	// Blocked counts the replicas on the server that no other server can
	// take now (up, not draining, with a free slab, holding none of the
	// slab's replicas nor sharing their failure domains); Reason says why,
	// for the first of them.
	Blocked int    `json:"blocked,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// GrantRequest is the coordinator asking a memory server (POST
// /v1/memserver/grant) for fresh keys on slabs.
type GrantRequest struct {
	Instance string      `json:"instance"`
	Indexes  []SlabIndex `json:"indexes"`
	// Epoch is the coordinator leader's term (its election key's creation
	// revision in etcd; 0 for a single coordinator). A memory server
	// refuses grants of an epoch older than the newest it has granted for
	// (pool.ErrStaleLeader): a deposed leader cannot revoke the keys its
	// successor handed out.
	Epoch uint64 `json:"epoch,omitempty"`
}

// GrantResponse carries one key per requested index, in order.
type GrantResponse struct {
	Keys []Key `json:"keys"`
}

// FreeRequest is the coordinator asking a memory server (POST
// /v1/memserver/free) to revoke keys and zero slabs.
type FreeRequest struct {
	Instance string      `json:"instance"`
	Slabs    []FreeEntry `json:"slabs"`
}

// FreeEntry is one slab to free.
type FreeEntry struct {
	Index SlabIndex `json:"index"`
	Key   Key       `json:"key"`
}

// HasServerView reports whether one of v's replicas is on id.
func (v *SlabView) HasServerView(id ServerID) bool {
	for _, r := range v.Replicas {
		if r.Server == id {
			return true
		}
	}
	return false
}
