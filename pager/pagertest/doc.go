// Package pagertest provides Store, an in-memory remote.Store for the
// pager's tests: a few memory servers (an rdma.Domain over heap memory each,
// served by the in-memory "mem" provider or by real "tcp" on loopback), slabs
// placed on R distinct servers, and the real replication and failover code
// of pager/slabio. Tests break servers (Kill: unreachable; Lose: data gone)
// and drain or repair slabs the way the pool would ask an agent to.
//
// It also fakes a client process: Kernel is one process's address space
// and userfaultfd (threads that fault, the ioctls that resolve faults),
// Process the shim's side of its agent connection (regions, the EVICT
// helper). With them the pager's loop runs its fault, eviction, budget and
// lost-page paths without root, a kernel feature or a child process. Clock
// is a fake time for the agent's decisions, and the fakes say when what a
// test waits for has happened (Kernel.Await, Process.WaitEvict), so that
// tests synchronize on events instead of sleeping.
//
// It is for tests, not production: placement is round-robin, there are no
// leases and servers live in the test process.
package pagertest
