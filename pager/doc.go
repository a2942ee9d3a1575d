// Package pager is rmem's paging engine: the regions that client processes
// hand to memagent, their page tables, fault handling, eviction under a
// local-memory budget, dirty tracking, prefetch and replication to the pool.
// docs/pager.md is the design it implements.
//
// It is not the kernel interface (package userfaultfd), not the transport
// (package rdma), not the wire protocol (pager/proto) and not the pool's
// bookkeeping (package pool); it consumes small interfaces over each:
// remote.Store and remote.PageIO for remote pages (pager/remote, the leaf
// package of the types they share; pager/poolstore over the pool,
// pager/pagertest in memory; both built on pager/slabio). It does not parse
// flags or print tables (cmd/memagent). What a loop needs of the kernel is
// faultFD (kernel.go), which pagertest.Kernel fakes for tests without root.
//
// # Pieces
//
//   - Agent: the Unix socket listener (SOCK_SEQPACKET, SO_PEERCRED checked
//     against HELLO), the client registry, the node-wide budget split,
//     Stats and a Prometheus collector.
//   - One loop per client process (RoutineServe on a locked OS thread):
//     polls the uffd, the client's socket, its pidfd and a wake eventfd;
//     serves faults in batches of up to 64 messages: zero page for pages
//     never written, one batched READ (plus prefetches) for pages in the
//     pool installed write-protected with UFFDIO_COPY, a staging-slot copy
//     for pages mid-eviction, UFFDIO_POISON for pages whose every replica
//     is gone (no silent zeros), UFFDIO_WRITEPROTECT faults mark pages
//     dirty. No allocation per fault: page buffers, work requests and
//     message buffers are preallocated per client.
//   - Eviction (evict.go): CLOCK with hot and cold pages (pagetable.go
//     says why: a page evicted that faults back before the hand comes
//     round is hot, the one read of a resident page user space sees)
//     picks victims past the high watermark; they are write-protected,
//     copied out and dropped by the client's own helper thread
//     (EVICT/EVICTED, so MAP_PRIVATE semantics hold), and dirty ones
//     written to a pool slot of their own (every replica of its slab). A
//     write racing an eviction waits (held fault) and is served after it.
//     Past the budget's margin a fault waits when no eviction can run
//     (back-pressure: the budget holds while the pool has no room).
//   - Pool space (slots.go): the agent's slabs carved into page slots
//     shared by all clients, taken at write-back and let go when the
//     copy is stale or gone; a reservoir goroutine keeps slabs ahead and
//     gives empty ones back, and drains scattered slabs (relocate.go),
//     so the space held follows the data (about 1.1x plus a slab).
//   - Prefetcher: Leap-style majority-trend detection, on each of up to
//     4 interleaved fault streams per region and on the jumps between
//     them (long strides).
//   - Fork (fork.go): the child's uffd from EVENT_FORK gets a loop of its
//     own at once; it names its parent's pool slots (counted: a
//     write-back always takes a slot of its own, so nothing is copied),
//     and it is paired with the child's HELLO by (parent pid, fork serial). A
//     child that never says HELLO (forked past fork(3)) is served all the
//     same and dropped when a probe finds its address space gone.
//
// # Limits
//
//   - A program whose pool has no room waits at its budget for as long
//     as it has none (docs/pager.md, Budget): never over budget, never a
//     lost page, but it does not run meanwhile.
//   - If a client's socket closes while an EVICT is in flight and the
//     process lives on, the batch's pages stay busy: faults on them wait
//     until the process exits.
//   - mremap of part of a region is not followed (its pages are dropped).
//   - A server that accepts requests and never answers holds up the loops
//     using it for the op deadline (pager/slabio: 2 s per round of posts),
//     then is skipped for 5 s; with one replica its pages wait until it
//     answers again.
//
// # Deadlocks
//
// The agent never touches a client's registered memory: it reads and
// writes pages only through UFFDIO_COPY, its own buffers and the staging
// memfd. Non-cooperative events (UNMAP, FORK; REMOVE for a client that
// asks for it, which the shim and the Go client do not) block the client
// until the loop reads them, so a loop never waits for the client while it
// has unread uffd messages: it only blocks in remote I/O (bounded by the
// Store's connections) and in sending a small packet. One EVICT is in
// flight per client. A FORK is handled inside the parent's loop once the
// eviction in flight is done: until its EVICTED comes, the fork is parked
// (fork.go) and the loop serves the socket; no handler re-enters the loop.
//
// # Concurrency
//
// Each client's state is owned by its loop goroutine; the agent talks to
// it only through client.ctl (under its mutex: a pending connection, the
// stop flag) and the wake eventfd. Counters are atomics, read by Stats
// and the collector. The loop reads the clock (Options.Now) once a turn
// and passes that time to the decisions it runs; timers only wake it.
// Agent.mu guards the registry and the fork-pairing table; it is never held
// while calling into a client. Close stops the accept loop, every client
// loop and every handshake, and waits for them.
package pager
