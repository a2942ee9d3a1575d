// Package swaprun runs a command with its memory overflowing to the pool
// through the kernel's swap: `memagent run --mode swap --local-mem SIZE --
// CMD`. It puts CMD in a memory cgroup limited to SIZE, so that what CMD
// uses beyond it is swapped out, and makes sure the swap it goes to is a
// pool swap file: if none is active it starts a `memagent mount` daemon
// (a separate process, outside the cgroup, mlockall'ed), attaches its file
// with swapon, and undoes both when CMD exits.
//
// It is NOT the filesystem (swapfs), the swap device plumbing
// (internal/swapdev) or the cgroup code (internal/cgroup): it sequences
// them around one command.
//
// # Runs share the swap
//
// The kernel's swap is global: a run that finds a pool swap file active
// uses it, and a swap file set up by a run is torn down by the last run on
// the host to end, not necessarily the one that set it up (tearing it down
// under another run would swap that run's pages back in, past its cgroup
// limit). The runs in progress and the swap files runs set up are kept in
// RuntimeDir/swaprun.json under an flock of RuntimeDir/swaprun.lock.
//
// # Killed runs
//
// A run records itself (pid, start time, cgroup) before creating
// anything, and a swap file it sets up as soon as its daemon runs. CMD is
// killed with its run (PR_SET_PDEATHSIG); what a killed run leaves (its
// cgroup, and the swap file once no live run remains) is removed by the
// next run and by Cleanup (`memagent cleanup`): see cleanup.go.
//
// # OOM
//
// cgroup v1 reclaim does not wait for swap writeback: with a swap device
// slower than the workload dirties memory, the kernel OOM-kills processes
// that the swap would have served a moment later (measured here: a
// quicksort at 25% local died in about one run out of four). In v1 Run
// turns the group's OOM killer off, so CMD waits for its pages to be
// written out instead, and RoutineWatchOOM watches it: a group under OOM
// with nothing moving is nudged (v1 does not wake it when writeback
// completes), and one whose pages do not move for Options.OOMGrace
// despite the nudges (swap full, pool gone) gets its OOM killer back:
// then CMD fails rather than hangs. See oom.go and OOMJudge.
//
// # Processes
//
// CMD runs as a child whose exit status is returned (128+N when killed by
// signal N, as shells report it); SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
// and SIGUSR2 received by the caller's process while CMD runs are
// forwarded to it. The cgroup is removed, killing what CMD left in it,
// when CMD exits. Once CMD has run, its exit code is Run's whatever goes
// wrong in the teardown, and a CMD ended by a signal is reported on
// Options.Stderr. A mount daemon of the run that dies under CMD is
// reported at once; CMD then gets SIGBUS at its next swap-in (EIO).
package swaprun
