// Package swapd assembles the `memagent mount DIR` daemon: a lease on the
// pool (pager/poolstore), the swap file system over it (swapfs) mounted on
// DIR, its Prometheus metrics, and when it may unmount: never while its
// swap file backs a loop device. cmd/memagent reads and checks its flags
// into Options and calls Run; `memagent umount DIR` calls Unmount.
//
// It is NOT the file system (swapfs), the swap device plumbing
// (internal/swapdev: losetup, mkswap, swapon), nor the swap-mode runner
// (internal/swaprun, which starts this daemon as a process of its own);
// it holds no pool logic and reads no flags, config files or environment.
// It only wires the pieces and owns their lifetimes.
//
// # Start and stop
//
// Run checks Options and where it runs before anything starts, mlockall's
// the process (Options.Lock), then takes the lease, opens the file
// system's transfers, listens for metrics and mounts, in that order. It
// serves until DIR is unmounted: from outside (umount, Unmount), or on a
// request (one of Options.StopSignals, or the end of its context).
// A request while the swap file backs a loop device is refused, logged,
// and the daemon keeps serving: the pages in that swap area live only
// here. Once unmounted, the metrics server, the file system (which frees
// its slabs) and the lease end, in that order, and Run returns.
//
// # Deadlocks
//
// Reclaim of the daemon's own memory must never wait on its own swap
// writes: Run refuses to start inside the memory cgroup of a swap-mode run
// (swaprun.GroupPrefix), and with Options.Lock every page of the process,
// now and later, stays resident. Nothing in the daemon's process may
// touch the mount (swapfs: a request and its server would tie up two
// threads).
package swapd
