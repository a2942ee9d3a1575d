// Package userfaultfd is a thin, typed Go API over Linux userfaultfd(2):
// open and handshake (Open, FromFD, Probe), register ranges in MISSING, WP
// and MINOR modes, resolve faults (Copy, ZeroPage, Continue, WriteProtect,
// Unprotect, Wake, Move, Poison), read and decode messages (ReadEvents,
// DecodeMsg, Poller), hand descriptors to another process (SendFDs,
// RecvFDs, PeerCred, TakeFD), and track written pages with asynchronous
// write protection and PAGEMAP_SCAN (DirtyScanner). Addresses are typed
// (Addr, Range) with overflow-checked arithmetic.
//
// It is NOT a pager: it decides nothing about which page to fetch, evict or
// prefetch, keeps no page table and starts no goroutine. The pager builds
// that policy on top of it.
//
// # Hot path
//
// Copy, ZeroPage, Continue, Wake, WriteProtect, Unprotect, ReadEvents and
// Poller.Wait allocate nothing when they succeed: ioctl arguments live on
// the stack and messages are read into a caller-owned []Msg. Errors are
// *OpError values that keep the errno (errors.Is(err, unix.EEXIST)); use
// IsExist (repeated fault: Wake the range), IsMMChanged (EAGAIN: partial
// progress or an mremap/fork in flight; read events and retry) and IsGone
// (the served process or mapping is gone).
//
// # Deadlocks
//
// Never resolve faults of memory that the resolving Go process itself
// touches: a goroutine that faults inside the runtime (memmove during a GC
// stop-the-world) waits for a resolver that cannot run. Serve other
// processes' memory (the uffd arrives over a Unix socket with SendFDs), or
// make the faulting access a system call (read(2)/write(2) into the range)
// so that the faulting goroutine sits in a syscall.
//
// When the last reference to a uffd is closed, threads blocked in its
// faults resume with zero-filled pages. A served process that must never
// see silent zeros keeps its own reference to the uffd (then it blocks
// instead) and the server uses Poison for pages that are truly lost.
//
// A FORK message blocks the forking process until it is read; a server
// that stops reading blocks fork(2) in the served process.
//
// # Concurrency
//
// UFFD methods may be called concurrently; Close must not race with
// anything but Poller waits, which it stops and waits for. A Poller's Wait
// may be called from several goroutines; Stop is safe from anywhere.
// DirtyScanner is for one goroutine at a time. UFFD.mu and Poller.mu are
// never held together.
package userfaultfd
