// Package swapfs is a FUSE filesystem holding one file, swap, whose 4 KiB
// blocks live in slabs of a remote.Store (the pool): the kernel swaps to it
// through a loop device with direct I/O (see internal/swapdev), so pages
// that overflow a memory cgroup go to pool memory with the same
// replication and failover as the pager.
//
// The mapping from block to remote address is derived: block b lives in
// slab b/BlocksPerSlab at byte (b%BlocksPerSlab)*4096. Slabs are allocated
// lazily, when a block of theirs is first written; a bitmap of written
// blocks lets never-written blocks read as zeros with no network traffic.
// The file is opened with FOPEN_DIRECT_IO: the kernel keeps no page-cache
// copy, so a swapped-out page really leaves the machine.
//
// A second, read-only file, stats, reads as the JSON of Stats (counters of
// requests, bytes to and from the pool, zero reads): tests and `memagent
// stats` read it.
//
// It is NOT the loop device, mkswap or swapon (internal/swapdev), nor the
// memory cgroup of the workload (internal/cgroup), nor the pool client
// (pager/poolstore supplies the Store).
//
// # Hot path
//
// Each READ or WRITE borrows a worker from a bounded pool (one PageIO and a
// preallocated op array each), plans its ops over the request's own buffer
// (no copy: reads land in the buffer go-fuse sends to the kernel, writes go
// out of the buffer it received), and returns the worker. Nothing is
// allocated per request in this package once the slabs exist; go-fuse's
// request handling has its own pools.
//
// # Failures
//
// A READ whose slab lost every replica fails with EIO (the kernel then
// kills the process that needed the page: never a silent zero page). A
// READ or WRITE that finds no replica reachable is retried for
// Options.Retry before it fails with EIO.
//
// # Concurrency
//
// go-fuse calls the FS from a goroutine per request; FS methods are safe
// for concurrent use. The written bitmap and the slab-id array are atomic
// words; allocMu serializes only the first write to a slab (one Alloc
// round trip). The FS starts no goroutine; Mount starts go-fuse's Serve,
// which returns when the file system is unmounted.
//
// # Deadlocks
//
// The daemon serving this filesystem must not be in the memory cgroup
// whose pages it swaps, and should be mlockall'ed: otherwise reclaim of its
// own memory waits for its own swap writes. Never access the mount from
// the serving process (go-fuse: a request and its server would tie up two
// threads).
package swapfs
