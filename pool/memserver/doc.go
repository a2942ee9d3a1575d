// Package memserver is the memory-server role of memd: it donates a fixed
// amount of this node's RAM to the pool, carved into slabs, and serves it
// through rdma listeners (tcp, shm). The coordinator tells it which slabs to
// grant (issue a read/write rdma key bound to one slab) and to free (revoke
// the key, then zero the slab), through Grant and Free in process or its
// small control endpoint (POST /v1/memserver/grant, /v1/memserver/free). It
// registers with the coordinator and heartbeats its state (RoutineJoin).
//
// It is not for placement or bookkeeping of tenants (the coordinator's), and
// it does not interpret slab contents.
//
// Memory: one rdma region (a memfd, so the shm provider can share it),
// backed by hugetlbfs pages when enough are free, else by transparent huge
// pages (advice), and mlock'ed. New checks MemAvailable and RLIMIT_MEMLOCK
// first and fails with an error naming the amounts.
//
// Safety: a slab is zeroed after its key is revoked (rdma.Domain.Revoke
// returns only when no op with the key can run), before it is granted again;
// a Free names the key it frees, so a late Free never zeroes a slab that was
// granted again since.
//
// # Concurrency and deadlocks
//
// Server.mu guards the slab table and is held across Revoke and zeroing, so
// grants and frees are serialised (a 64 MiB zeroing takes a few ms);
// heartbeats and metrics do not take it. A same-host (shm) client stopped
// inside an op stalls Revoke, and so every grant and free, until the
// caller's context ends (the coordinator's call timeout); the slab is then
// neither zeroed nor reused, its key stays recorded, and the coordinator
// retries the free later.
// Goroutines: the rdma listeners' own, and RoutineJoin, stopped by its ctx.
package memserver
