// Package poolstore is the remote.Store of a real agent: remote memory leased
// from the pool's coordinator (pool/client over HTTP) and moved with rdma
// to the memory servers that hold each slab's replicas.
//
// It holds one lease, created by Open and renewed by its own goroutine every
// TTL/3; each renewal returns the pool's events about the lease's slabs,
// and the Store restores redundancy from them: for a replica that is lost
// (dead or restarted server) or draining, and for a replica that missed a
// WRITE (slabio marks it stale), it asks for a replacement (Replace), copies
// the slab from a surviving replica while the pager keeps using it
// (slabio.Table.Migrate), and reports the copy done (Migrated), which frees
// the old replica. A slab whose every replica is lost stays in the table
// as lost, so its pages fault with remote.ErrLost (SIGBUS), never zeros.
//
// It is NOT the placement policy (the coordinator's) and does not decide
// what to page: it only supplies and maintains slabs.
//
// # Concurrency
//
// Store methods are safe for concurrent use. Goroutines: RoutineRenew
// (started by Open, stopped by Close). Migrations run on it one at a time;
// PageIOs keep working meanwhile (see slabio).
package poolstore
