// Package preload holds librmem.so, rmem's LD_PRELOAD shim (rmem.c, the
// C mirror of the protocol in proto.h), and the Go tests that build it
// with gcc and run C programs and python3 under it against a small test
// agent. `make` builds bin/librmem.so; `memagent run` preloads it.
//
// What the shim does: allocations of at least min-alloc bytes (the
// RMEM_MIN_ALLOC environment variable, else the agent's WELCOME, else
// 1 MiB) made with malloc, calloc, realloc, reallocarray, posix_memalign,
// aligned_alloc, memalign, valloc, pvalloc, or as private read/write
// anonymous mmaps, become their own mappings registered MISSING|WP with
// the process's userfaultfd and announced to memagent (REGION_ADD, then
// the memory is returned). Smaller ones go to glibc. A helper thread
// serves the agent's EVICT commands (copy to the staging memfd, then
// MADV_DONTNEED, inside the process: private-memory semantics hold, also
// across fork). With no agent the shim says so once on stderr and uses
// ordinary memory.
//
// What it is NOT: an allocator (glibc keeps small blocks; a large block is
// a whole mapping), a pager (the agent decides what to fetch and evict),
// nor a way to page shared, file-backed, MAP_FIXED, MAP_POPULATE, locked
// or PROT_NONE mappings: those pass through untouched (rmem.c says why).
//
// Other allocators: one linked statically into the program, or preloaded
// in front of the shim (jemalloc), keeps its malloc and gets its chunks
// from mmap, which the shim pages (their munmap trims and MADV_DONTNEED
// work). tcmalloc ships its own mmap wrapper: in front of the shim its
// chunks never reach the shim (nothing is paged, the program works);
// behind it the shim's malloc wins. When another malloc is in front, the
// helper thread is created by the shim's constructor (creating a thread
// allocates, which would deadlock inside that allocator's mmap), and mmaps
// made before the constructor ran stay ordinary memory.
//
// # Deadlocks
//
// A shimmed process depends on its agent: once pages are evicted, touching
// them waits for the agent. The shim keeps its own reference to its
// userfaultfd, so if the agent dies those accesses block (never read as
// zeros), and so does fork() of a process that holds regions (the kernel
// waits for the agent to read the FORK event). New allocations after the
// agent is lost use ordinary memory.
//
// Inside the process: the helper thread is the only reader of the agent
// socket; program threads make one request at a time (req_mu) and the
// helper hands them their reply. The helper holds the region table lock
// while it copies and drops victims, so a region cannot be unmapped under
// it. The shim asks for no REMOVE events (each would block the helper's
// MADV_DONTNEED until the agent read it); the program's own dropping
// madvise calls reach the agent as REGION_ZAP before the kernel drops the
// pages (docs/pager.md).
//
// fork() is wrapped, and forks inside the C library (daemon()'s) are
// caught by atfork handlers: either holds the shim's locks across the real
// fork, so the region set is frozen while other libraries' atfork handlers
// run (their big allocations go to glibc, their unmaps of regions wait
// until fork returns) and the FORK event, the fork serial and the child
// agree.
//
// # Known limits
//
// Growing a region with realloc or mremap copies it (page faults served by
// the agent), it is not moved by the kernel. A fork that fails after the
// kernel raised its FORK event (a pids-cgroup limit) is not counted, and
// the serials of later children are then off by one (the shim warns on
// stderr when a fork fails in a process holding regions); so is a fork
// inside the C library (glibc's daemon()), seen by atfork handlers, which
// cannot tell a failed fork. A child made past fork(3) and its atfork
// handlers (_Fork(), a raw clone) does not inherit the regions: they are
// MADV_DONTFORK except across the forks the shim sees, so touching one in
// such a child raises SIGSEGV (never zeros), and no FORK event is raised
// whose serial the shim would not count. The child notices at its first
// call into the shim that it is not the process that connected, reserves
// the regions' addresses inaccessible and uses ordinary memory.
package preload
