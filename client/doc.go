// Package client pages a Go program's large buffers to the rmem pool:
// Map(size) returns memory that memagent serves with userfaultfd (pages
// fetched from the pool on fault, evicted under the agent's budget), and
// Unmap gives it back. The LD_PRELOAD shim cannot reach the Go heap;
// memagent run pages a whole Go program from outside it instead (package
// traced), and this package lets a Go program page chosen buffers itself.
//
// It speaks pager/proto as the shim does: HELLO with the process's uffd,
// WELCOME with the staging memfd, REGION_ADD/REGION_DEL (acknowledged
// before Map returns or Unmap unmaps), and a helper goroutine that serves
// EVICT: it copies each victim page into its staging slot and drops it
// with MADV_DONTNEED, from this process, so private-memory semantics hold.
//
// It is NOT a general allocator (each Map is its own mapping, rounded up
// to whole pages: use it for big buffers) and it does not serve faults:
// the agent, another process, does.
//
// # Deadlocks
//
// Faults of mapped memory are served by memagent, never by this process,
// so a goroutine faulting inside the runtime (say, a memmove during a GC
// stop-the-world) waits for the agent (DESIGN.md pitfall 1). The helper
// reads only pages the agent has just write-protected and knows to be
// resident. The process keeps its own reference to the uffd: if the agent
// dies, a fault on an evicted page blocks instead of reading zeros.
//
// Known limit: two kinds of fault wait for the helper goroutine, not only
// for the agent: a write to a page whose eviction is in flight (until the
// helper answers EVICTED, about 100 µs) and a fault past the budget (the
// agent holds it for at most 50 ms while the helper evicts). If a GC
// stop-the-world begins while a goroutine sits in such a fault inside a
// function the runtime cannot preempt, the helper is stopped too and the
// fault is served only when the agent's bound expires (budget) or not at
// all (eviction in flight). The C shim has no such limit (its helper is a
// plain thread). With GOMAXPROCS=1 faults past the budget are slow: the
// helper runs only when the scheduler preempts the faulting goroutine.
//
// Do not fork without exec: the child is not paged. Do not give pages of
// a mapping back with madvise(MADV_DONTNEED): the agent is not told (the
// shim tells it with REGION_ZAP; this package asks the kernel for no
// REMOVE events), so evicted pages would come back with their old
// contents. Unmap instead.
//
// # Concurrency
//
// Map, Unmap and Close are safe for concurrent use. The helper goroutine
// runs on a locked OS thread from Connect until Close. Client.mu guards the
// region table and is never held while waiting for the agent.
package client
