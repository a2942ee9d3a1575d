// Package client pages a Go program's large buffers to the rmem pool:
// Map(size) returns memory that memagent serves with userfaultfd (pages
// fetched from the pool on fault, evicted under the agent's budget), and
// Unmap gives it back. Go programs need it because the LD_PRELOAD shim
// cannot reach the Go heap.
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
// stop-the-world) waits only for the agent (DESIGN.md pitfall 1). The
// helper reads only pages the agent has just write-protected and knows to
// be resident. The process keeps its own reference to the uffd: if the
// agent dies, a fault on an evicted page blocks instead of reading zeros.
// Do not fork without exec: the child is not paged.
//
// # Concurrency
//
// Map, Unmap and Close are safe for concurrent use. The helper goroutine
// runs on a locked OS thread from Connect until Close. Client.mu guards the
// region table and is never held while waiting for the agent.
package client
