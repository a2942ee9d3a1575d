// Package pool holds the pool's data model and the decisions the coordinator
// makes over it, as plain functions over plain values: where to place the
// replicas of new slabs (Place), which leases have expired (Expired), which
// servers have missed their heartbeats (Dead), and what an agent must be told
// about its slabs (EventsFor). It also defines the JSON types of the control
// API (docs/api.md), shared by the coordinator, its client and the memory
// servers.
//
// It is not for I/O: it starts no goroutines, opens no files or sockets and
// reads no clock (time is always an argument). The coordinator service that
// wraps these functions with a Store and an HTTP API is pool/coord; the
// memory-server role is pool/memserver; metadata storage is pool/store.
//
// Vocabulary: a server donates Slabs fixed-size slabs, named by SlabIndex
// within the server. An agent holds a Lease; it allocates logical slabs
// (SlabID), each made of R replicas, one physical slab on each of R distinct
// servers (and distinct failure domains when servers carry them). A replica
// is reached with the rdma Key the memory server issued for it, which is
// revoked, and the memory zeroed, when the replica is freed.
package pool
