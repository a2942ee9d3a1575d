// Package preload holds librmem.so, rmem's LD_PRELOAD shim (src/: one
// internal header, rmem.h, with the files' layers, the lock order and who
// owns what, and a file per concern; proto.h is the C mirror of
// pager/proto), and the Go tests that build it
// with build.sh and run C programs, python3 and redis-server under it
// against a small test agent. `make` builds bin/librmem.so; `memagent run`
// preloads it. build.sh is the only build: it links the jemalloc of
// Debian's libjemalloc_pic.a (package libjemalloc-dev) into the shim,
// renamed and hidden.
//
// How the C is kept: each piece of shared state (the connection, the
// region table, the mode and the per-thread guards, the configuration,
// the helper thread, the heap's reservation) is written by one file
// only, through that file's functions: the connection changes through
// named transitions in conn.c (connect, lost, resume, orphan, astray, the
// fork steps), and what a signal handler may read of it is atomic. The
// files form layers (`make shim-layers` fails when a file uses what a
// file above it defines, beyond the one exception rmem.h names), and
// every symbol shared between them starts with rm_.
//
// What the shim does: it pages the process's memory through the agent.
// Memory becomes regions, registered MISSING|WP with the process's
// userfaultfd and announced to memagent (REGION_ADD); a helper thread
// serves the agent's EVICT commands (copy to the staging memfd, then
// MADV_DONTNEED, inside the process: private-memory semantics hold, also
// across fork). With no agent the shim says so once on stderr and uses
// ordinary memory. How malloc is paged depends on a mode, decided once per
// process at its first call into the shim:
//
//   - glibc mode: the program's malloc is the shim's and the next one is
//     glibc's. The shim is then the process's allocator: every
//     allocation, of any size, comes from the embedded jemalloc, whose
//     memory lives in one reserved range (1 TiB of address space, no
//     memory) whose 64 MiB segments in use are regions (kind heap). So
//     small allocations are paged too. A pointer in that range goes back
//     to jemalloc, any other to glibc (the shim's own allocations, and
//     those made inside a fork, come from glibc).
//   - foreign mode: another allocator is the program's (jemalloc, tcmalloc
//     or mimalloc linked after the shim, as redis-server links jemalloc;
//     or one in the executable). Every malloc-family call the shim
//     exports goes to it, those it lacks are built on those it has, and
//     its memory is paged where it arrives, through mmap or sbrk.
//
// In both modes private anonymous mmaps of min-alloc bytes (the
// RMEM_MIN_ALLOC environment variable, else the agent's WELCOME, else
// 64 KiB) up to 64 GiB, of any protection (PROT_NONE reservations too),
// and sbrk'd heaps of that size, become regions (kind mmap); MAP_FIXED
// mappings over a region keep the memory in it (REGION_ZAP: the contents
// are gone), munmap is REGION_DEL, madvise(MADV_DONTNEED or MADV_FREE) is
// REGION_ZAP and then MADV_DONTNEED, MADV_HUGEPAGE is ignored there.
//
// Every MAP_SHARED (or MAP_SHARED_VALIDATE) mapping of a shared memory
// segment of those sizes becomes a region too (kind shared), of any
// length, protection and offset, MAP_FIXED included: MAP_SHARED|
// MAP_ANONYMOUS, and mappings of a file on shmem (tmpfs: shm_open's
// /dev/shm, memfd_create). One the shim cannot register (read-only,
// MAP_LOCKED, a full table) is announced unpaged. The agent pages their
// pages once per segment for every process that maps it; the shim
// announces and follows the mappings, and says (HANDOFF, handoff.c) before
// a descriptor that may reach a segment leaves the agent's sight (exec,
// posix_spawn, system, popen; sendmsg and sendmmsg with SCM_RIGHTS) and
// before the first read or write through a descriptor it mapped one
// through. They differ from private regions where the kernel
// does: madvise(MADV_DONTNEED, MADV_FREE) drops only the process's view of
// the pages, so it goes to the kernel unchanged with no REGION_ZAP (FREE
// fails there, EINVAL, as without the shim), while MADV_REMOVE punches the
// file and is a REGION_ZAP first; MAP_FIXED over one takes the piece out
// of the region (REGION_DEL, never REGION_ZAP) and the new mapping is
// ordinary memory; mremap does not move or grow one (ENOMEM, as when the
// kernel finds no room): a copy would end the sharing; the helper refuses
// an EVICT of one (EFAULT).
//
// What it is NOT: a pager (the agent decides what to fetch and evict),
// nor a way to page other file-backed mappings, MAP_POPULATE, MAP_LOCKED
// or huge-page mappings, nor shared memory attached with shmat (SysV): those
// pass through untouched. It is not a choice of allocator either: a program
// linked with another allocator keeps it.
//
// # Deadlocks
//
// A shimmed process depends on its agent: once pages are evicted, touching
// them waits for the agent. The shim keeps its own reference to its
// userfaultfd, so if the agent dies those accesses block (never read as
// zeros), and so does fork() of a process that holds regions (the kernel
// waits for the agent to read the FORK event), until the next agent
// resumes the process or RMEM_AGENT_WAIT runs out. Once orphaned, the
// helper thread reads the FORK event of a fork itself. New memory after
// the agent is lost is ordinary memory. Regions are unregistered before
// they are unmapped or mapped over, so that munmap never waits for an
// agent reading an UNMAP event.
//
// Inside the process: the helper thread is the only reader of the agent
// socket; program threads make one request at a time (req_mu) and the
// helper hands them their reply (conn.c). The helper holds the region table lock
// while it copies and drops victims, so a region cannot be unmapped under
// it, and it touches no memory that could fault then: it checks that its
// victims are resident (mincore) and reads mprotect-ed ones through
// /proc/self/mem. Allocators call the shim's mmap, munmap and madvise
// holding their own locks, so nothing on those paths (nor on the connect
// and handshake path they may take) allocates, and the helper thread is
// created by the constructor, never on an allocation path (creating a
// thread allocates). A fork takes the allocators' locks before the
// shim's: the shim's atfork handlers are registered at its first call,
// before the allocators that call it register theirs, so that its prepare
// handler runs after theirs (and it calls the embedded jemalloc's
// handlers itself); the lock order is in src/rmem.h.
//
// fork() is wrapped, and forks inside the C library (daemon()'s) are
// caught by the same atfork handlers: they hold the shim's locks across
// fork(2), so the region set is frozen while the handlers of libraries
// registered before the shim run (their allocations come from glibc,
// their frees and unmaps of the heap wait until fork returns) and the
// FORK event, the fork serial and the child agree. The wrapper adds the
// child's pid or the failure to FORK_DONE, which an atfork handler cannot
// know.
//
// # Ring mode (RMEM_IN_THREAD=1, memagent run --in-thread)
//
// The uffd raises SIGBUS in the faulting thread, whose handler (sigbus.c)
// posts the fault to the fault ring and waits there (ring.c). The price:
// a kernel access to a missing page, or a kernel write to a clean page
// installed write-protected, fails with EFAULT instead of faulting. So:
//
//   - the libc calls that hand the kernel buffers (kcall.c, kmisc.c,
//     kwait.c: read/write and their p*/v* kin, recv*/send*, the stat
//     family, getdents64, readdir, paths of open and its kin, pipe,
//     uname, accept, waitpid, poll/select/epoll_wait*, the sleeps and
//     signal waits, stdio's fread/fwrite, futex through syscall(3),
//     glibc's mutex, condvar, semaphore, rwlock and barrier waits) pin
//     their buffers against eviction (pin.c; the helper keeps a pinned
//     page, EBUSY) and make them present from user mode first; a
//     retry-safe call is retried after an EFAULT. What is pinned stays
//     resident, so read, write, pread, pwrite, recv, send, fread and
//     fwrite of more than 1 MiB (RM_CALL_CHUNK) go to the kernel a pinned
//     chunk at a time on files, pipes and stream sockets (a stream's read
//     returns one chunk, a short read, but for MSG_WAITALL); other big
//     buffers (readv, sendmsg, a datagram) are pinned whole, and the agent lets a fault through
//     past the budget while every victim is pinned;
//   - SIGBUS is never blocked (sigwrap.c: every mask libc sets leaves it
//     out) and the program's SIGBUS disposition is recorded behind the
//     shim's handler, which chains to it for faults that are not the
//     pager's; an alternate signal stack is pinned while it is set;
//   - posix_spawn, popen, system and exec make what the child or the
//     kernel reads present and pinned (spawn.c); glibc's own small
//     allocations (stdio buffers, DIRs) stay in glibc's heap (alloc.c).
//
// Not seen, so still EFAULT on an evicted buffer: raw system calls (not
// through libc or syscall(3)), glibc's other calls from inside itself
// (scandir's getdents, a process-shared lock's wake), ioctl and
// fcntl arguments, io_uring buffers, and rt_sigprocmask issued raw with
// SIGBUS in the mask (a fault then kills the process). A call that is not
// retry-safe (a datagram's recv, an eventfd's read) relies on its pin
// alone. system() pins its command and environment, not everything, for
// the command's length; posix_spawn and popen pin everything until the
// child has exec'd.
//
// # Known limits
//
// A child forked after its parent lost its agent (orphaned; or off, after
// a malformed packet) gets no agent either, and never its parent's uffd:
// it inherits the regions and registers them with a uffd of its own that
// raises SIGBUS on every missing page, as its orphaned parent does (the
// pages that were in the pool, and also pages of the regions never
// touched: in glibc mode the heap's fresh pages). Off with FORK events (the
// agent, never told, may still read the parent's uffd and would keep the
// child's) it does not inherit them: their addresses are reserved
// inaccessible (SIGSEGV), and in glibc mode it has no heap and allocates
// from glibc, as a child made past fork(3) does.
//
// Growing a region with mremap copies it (page faults served by the
// agent), it is not moved by the kernel; a region with pages mprotect-ed
// or mapped without read and write access, or a shared one, is not moved
// (ENOMEM). A fork
// that fails after the kernel raised its FORK event (a pids-cgroup limit)
// is not counted, and the serials of later children are then off by one
// (the shim warns on stderr when a fork fails in a process holding
// regions); so is a fork inside the C library (glibc's daemon()), seen by
// atfork handlers, which cannot tell a failed fork. A child made past
// fork(3) and its atfork handlers (_Fork(), a raw clone) does not inherit
// the regions: they are MADV_DONTFORK except across the forks the shim
// sees, so touching one in such a child raises SIGSEGV (never zeros), and
// no FORK event is raised whose serial the shim would not count. The
// child notices at its first call into the shim, reserves the regions'
// addresses inaccessible and uses ordinary memory; in glibc mode its heap
// is gone with its regions, and its allocations come from glibc. tcmalloc
// preloaded in front of the shim brings its own mmap and sbrk: nothing it
// maps reaches the shim. An allocator whose atfork handlers were
// registered before the shim's first call can deadlock a fork against a
// thread inside its mmap. Pages an allocator touched before the agent was
// connected (before the constructor) stay resident outside the agent's
// view. The embedded jemalloc reads RMEM_MALLOC_CONF, not MALLOC_CONF, and
// has no heap profiler.
package preload
