// Package rdma moves pages between agents and memory servers with the
// semantics of RDMA verbs: registered memory regions, remote keys, reliable
// connections (RC queue pairs) carrying one-sided READ, WRITE,
// COMPARE_AND_SWAP and FETCH_ADD, and completion queues.
//
// The pager and the memory server are written once against this API; the
// providers carry it:
//
//	rmem/rdma/tcp      software RDMA over TCP (default; optional TLS)
//	rmem/rdma/shm      same host: the client maps the server's memfd and
//	                   executes ops itself, with no server CPU
//	rmem/rdma/rdmatest in-memory provider for other packages' unit tests,
//	                   and the conformance suite every provider passes
//
// Importing a provider registers it by name for Dial and Listen
// ("tcp", "shm", "mem").
//
// # Mapping onto verbs
//
//	Domain          protection domain (ibv_alloc_pd)
//	Region          memory region (ibv_reg_mr); AllocRegion makes a memfd
//	Key             rkey of a memory window bound to a sub-range (ibv_bind_mw),
//	                but 128 random bits and revocable
//	Conn            RC queue pair + its send and completion queues
//	Conn.Post       ibv_post_send of a WR list (all or nothing here)
//	Conn.Poll/Wait  ibv_poll_cq / completion channel
//
// # Server side
//
// A memory server allocates its memory (AllocRegion), registers it in a
// Domain, issues keys for sub-ranges (IssueKey: e.g. one 64 MiB slab, read
// or read/write), serves the domain with one or more listeners
// (rdma.Listen("tcp", ...), rdma.Listen("shm", ...)) and revokes keys when
// slabs are freed (Revoke). After Revoke returns nil no op with the key is
// running or can start in any provider, so the slab may be zeroed and
// handed to another tenant. Domain.Stats counts server-executed ops.
//
// # Client side
//
// Dial returns a Conn. Post a batch of WorkRequests, then Poll or Wait for
// Completions; Read, Write, CompareAndSwap and FetchAdd wrap one op. A WR's
// Offset is relative to the start of its key's range; its Local buffer
// belongs to the provider until its completion has been returned (a READ
// lands in it directly).
//
// # Ordering
//
// The ops of one Conn execute in posting order and complete in posting
// order, as on an RC queue pair: a READ posted after a WRITE to the same
// bytes returns the written data, and completion i is returned before
// completion i+1. There is no ordering between different Conns.
//
// # Errors
//
// A bad request (unknown or revoked key, out of bounds, permission,
// misaligned atomic) completes with an error Status; the connection stays
// usable. A transport failure completes every outstanding request with
// StatusTransport and fails later Posts with ErrTransport; Dial again.
// Post rejects (posting none) with ErrQueueFull beyond the queue depth; it
// does not block.
//
// # What it is not
//
// Not a general RPC or messaging layer (no SEND/RECV), not a memory
// allocator (slabs are the pool's business), and not a security boundary
// against a malicious process on the same host that is handed a memfd (see
// rmem/rdma/shm).
//
// # Concurrency and deadlocks
//
// Lock order: Region.mu before Domain.mu. The per-op path (Session.Begin,
// End) takes no lock: keys are looked up in a copy-on-write snapshot. Conn
// methods are safe for concurrent use; a Conn runs at most one goroutine of
// its own (shm's control reader; tcp has none: replies are read in Wait),
// stopped by Close. Revoke blocks while server-side ops with the key run;
// it aborts their connections after DomainOptions.RevokeGrace, so a
// stalled client cannot stall it for long. An shm client stopped inside an
// op (SIGSTOP) does stall it: pass a ctx with a deadline and do not reuse
// the memory if Revoke fails.
package rdma
