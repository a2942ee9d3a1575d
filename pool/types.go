package pool

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ServerID names a memory server in the pool (by default its host name).
type ServerID string

// LeaseID names an agent's lease. It is random and issued by the coordinator.
type LeaseID string

// SlabID names a logical slab (all its replicas). It is issued by the
// coordinator, never reused, and is > 0.
type SlabID uint64

// SlabIndex is a physical slab's position in its server's donated memory:
// the slab covers [Index*SlabSize, (Index+1)*SlabSize).
type SlabIndex uint32

// Key is an rdma key in its hex text form (rdma.Key.String). The pool passes
// keys through without interpreting them.
type Key string

// ServerState is a memory server's membership state.
type ServerState string

const (
	ServerUp   ServerState = "up"   // heartbeating
	ServerDead ServerState = "dead" // missed heartbeats past the timeout
	ServerLeft ServerState = "left" // left the pool on purpose
	// ServerUnknown is never stored: the views show it for a server that
	// is up in the store but has not been heard from (registration or
	// heartbeat) since this coordinator loaded its state. It becomes up
	// at its first heartbeat, or dead after a heartbeat timeout.
	ServerUnknown ServerState = "unknown"
)

// Duration is a time.Duration that travels in JSON as text ("30s", "1m30s").
// Plain numbers are read as milliseconds.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		ms, nerr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if nerr != nil {
			return errors.New("want a duration such as \"30s\" or a number of milliseconds")
		}
		*d = Duration(time.Duration(ms) * time.Millisecond)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"30s\": %w", err)
	}
	*d = Duration(v)
	return nil
}

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// ServerInfo is what a memory server says about itself when it registers.
type ServerInfo struct {
	ID ServerID `json:"id"`
	// Instance changes each time the server process starts: memory (and
	// every key) of an older instance is gone.
	Instance string `json:"instance"`
	// Domain is the failure domain (rack, host, zone); replicas of a slab
	// never share one. Empty: the server is its own domain.
	Domain string            `json:"failure_domain,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Addrs are the data-plane addresses by rdma provider, e.g.
	// {"tcp": "10.0.0.5:7471", "shm": "/run/rmem/memd-data.sock"}.
	Addrs map[string]string `json:"addrs"`
	// ControlURL is where the coordinator asks the server to grant and free
	// slabs (empty when the server runs inside the coordinator's process).
	ControlURL string `json:"control_url,omitempty"`
	// ControlSecret is made up by the server at start and sent when it
	// registers; the coordinator presents it (ControlSecretHeader) on
	// grant and free, so only the coordinator, not every holder of the
	// pool's token (each agent), can revoke and zero a slab. The API never
	// shows it.
	ControlSecret string `json:"control_secret,omitempty"`
	SlabSize      uint64 `json:"slab_size"`
	Slabs         int    `json:"slabs"`
}

// Capacity returns the bytes the server donates.
func (s *ServerInfo) Capacity() uint64 { return s.SlabSize * uint64(s.Slabs) }

// Server is the coordinator's durable record of a memory server.
type Server struct {
	ServerInfo
	State      ServerState `json:"state"`
	Draining   bool        `json:"draining"`
	Registered time.Time   `json:"registered"`
}

// Heartbeat is a memory server's periodic report of its state.
type Heartbeat struct {
	Instance string  `json:"instance"`
	Granted  int     `json:"granted"` // slabs with a live key
	Load     float64 `json:"load"`    // data-plane ops per second since the last heartbeat
}

// Lease is an agent's claim on the pool. Its slabs are freed when it expires.
type Lease struct {
	ID      LeaseID   `json:"id"`
	Agent   string    `json:"agent"`
	Node    string    `json:"node"`
	PID     int       `json:"pid"`
	TTL     Duration  `json:"ttl"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	// Secret is the lease's credential, in the answer to POST /v1/leases
	// only (the coordinator keeps a hash): requests about the lease's slabs
	// present it in the LeaseSecretHeader header. An agent that takes over
	// the lease after a restart needs it: keep it with the lease id.
	Secret string `json:"secret,omitempty"`
}

// ControlSecretHeader carries a memory server's ControlSecret on the
// coordinator's grant and free requests.
const ControlSecretHeader = "Rmem-Control-Secret"

// LeaseSecretHeader carries a lease's Secret on the requests about the
// lease (renew, end, allocate, list its slabs with their keys, free,
// replace, migrated).
const LeaseSecretHeader = "Rmem-Lease-Secret"

// Replica is one physical copy of a logical slab.
type Replica struct {
	Server   ServerID  `json:"server"`
	Index    SlabIndex `json:"index"`
	Key      Key       `json:"key"`
	Instance string    `json:"instance"`        // the server instance that issued Key
	Shard    int       `json:"shard,omitempty"` // its place in an erasure-coded slab (Slab.Layout)
}

// Slab is a logical slab: the replicas of one unit of an agent's memory.
type Slab struct {
	ID     SlabID  `json:"id"`
	Lease  LeaseID `json:"lease"`
	Size   uint64  `json:"size"`
	Layout string  `json:"layout,omitempty"` // AllocateRequest.Layout
	// Group and Part: under Layout "stripe:K", the slab is part Part of
	// the K slabs allocated together whose first is Group.
	Group    SlabID    `json:"group,omitempty"`
	Part     int       `json:"part,omitempty"`
	Replicas []Replica `json:"replicas"`
	// While a replica is being replaced (drain, lost server) Replicas holds
	// the new one too: the old one is dropped when the agent reports the
	// migration done.
	Created time.Time `json:"created"`
}

// HasServer reports whether one of s's replicas is on id.
func (s *Slab) HasServer(id ServerID) bool {
	for _, r := range s.Replicas {
		if r.Server == id {
			return true
		}
	}
	return false
}

// Errors returned by the decision functions and by the coordinator. Test
// with errors.Is; the HTTP API maps them to status codes.
var (
	ErrNotFound     = errors.New("pool: not found")
	ErrNoCapacity   = errors.New("pool: not enough capacity")
	ErrInvalid      = errors.New("pool: invalid request")
	ErrConflict     = errors.New("pool: conflict")
	ErrLeaseExpired = errors.New("pool: lease expired")
	ErrUnauthorized = errors.New("pool: unauthorized")
	// ErrForbidden: a request about a lease without that lease's secret
	// (pool.LeaseSecretHeader), or with another.
	ErrForbidden      = errors.New("pool: forbidden")
	ErrServerDead     = errors.New("pool: server is not up")
	ErrStaleInstance  = errors.New("pool: stale server instance")
	ErrGrantFailed    = errors.New("pool: memory server did not grant the slab")
	ErrCoordinatorOff = errors.New("pool: coordinator stopped")
	// ErrNotLeader: this coordinator is not the leader (HA over etcd):
	// ask the leader (the error response names it when known).
	ErrNotLeader = errors.New("pool: not the leader coordinator")
	// ErrStaleLeader: a memory server refused a grant from a coordinator
	// whose term is older than one it has already served (fencing).
	ErrStaleLeader = errors.New("pool: request from a deposed coordinator leader")
)
