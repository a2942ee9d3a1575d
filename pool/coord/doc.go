// Package coord is the pool coordinator: membership of memory servers
// (register, heartbeat, leave, dead after a timeout), agents' leases (TTL,
// renewal, expiry), slab allocation with replicas (placement by pool.Place),
// replacement and migration of replicas (drain, lost servers), its HTTP/JSON
// control API (docs/api.md) and its Prometheus metrics.
//
// Coordinator is a thin service around the decision functions of package
// pool and a store.Store: every change is written to the store before it is
// visible, and New rebuilds the state from the store, so a restarted
// coordinator loses no server, lease or slab. Heartbeat times and lease
// expiry times are not stored: after a restart every server and lease gets a
// full timeout (TTL) from the restart.
//
// The state is cached in memory and the store is written through, so one
// coordinator owns a store at a time (bbolt's file lock enforces it); with a
// shared store (etcd, later) coordinators will need leader election and a
// reload on taking over.
//
// It is not for moving data: agents copy slabs themselves (rdma) and report
// migrations done; memory servers issue and revoke keys when the coordinator
// asks them through the SlabServer interface.
//
// # Keys and freeing
//
// Allocate asks each chosen server to Grant keys for the reserved slab
// indexes before it answers, so a key handed to an agent works at once.
// Freeing (free, migrated, lease expiry or deletion) drops the records first,
// then asks the servers to revoke the keys and zero the slabs; an index is
// reusable only when its server confirmed, and failed frees are retried by
// Tick. A memory server must treat Grant of a slab that still has a key as
// revoke + zero + new key: that covers a coordinator that crashed before a
// free was confirmed (the old key stays usable by its old holder, for its
// own data only, until the slab is granted again).
//
// # Concurrency and deadlocks
//
// One mutex, Coordinator.mu, guards all state and is held across store
// writes (so the store's order is the state's order) but never across calls
// to memory servers: Allocate reserves indexes under mu, grants without it,
// and commits under it again. Methods ending in Locked need mu held.
// Goroutines: RoutineSweep (stopped by its ctx); during Allocate and
// frees, one short-lived goroutine per memory server contacted; and the
// frees Migrated and Tick leave running behind them (freeLater), and those
// FreeSlab, DeleteLease and a failed Allocate or Replace wait for up to a
// second before they leave them running (freeSoon), each bounded by
// CallTimeout, which Close waits for. No request waits for a server's
// CallTimeout on a free.
package coord
