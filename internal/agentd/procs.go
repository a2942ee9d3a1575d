package pager

import (
	"runtime"
	"sync"
)

// Each client loop is a goroutine locked to its OS thread that spends its
// time blocked in system calls (poll, ioctl, the READ's wait) while holding
// its P: the runtime takes a P back from a thread in a system call only
// after a sysmon tick (20 µs or more), and when it has, the loop returning
// from the call finds no P and waits to be handed one: two more thread
// wake-ups, tens of µs each on these VMs (internal/cpuidle). With more
// clients than GOMAXPROCS, the loops' faults queued for Ps: 4 programs
// faulting at random under one agent took 3.8-3.9 s at GOMAXPROCS 2 and
// 2.8-3.1 s at 8 (one program alone: 2.5 s). So the agent adds a P per
// running loop, up to maxLoopProcs: the loops run Go code only between
// system calls, so the extra Ps cost no CPU.
//
// Changing GOMAXPROCS stops the world for a moment: once per client
// connect and exit. It also ends the runtime's own updates of GOMAXPROCS
// to a cgroup's CPU limit; the base is read when the first loop starts.

// maxLoopProcs bounds the Ps added for loops (a GC uses a quarter of the
// Ps; thousands of clients must not make it that many workers).
const maxLoopProcs = 64

var loopProcs struct {
	sync.Mutex
	base  int // GOMAXPROCS when no loop runs
	loops int
}

// loopStarted adds a P for a loop that starts.
func loopStarted() {
	loopProcs.Lock()
	defer loopProcs.Unlock()
	if loopProcs.loops == 0 {
		loopProcs.base = runtime.GOMAXPROCS(0)
	}
	loopProcs.loops++
	setLoopProcs()
}

// loopStopped takes back the P of a loop that ended; with the last one,
// GOMAXPROCS is what it was before the first.
func loopStopped() {
	loopProcs.Lock()
	defer loopProcs.Unlock()
	loopProcs.loops--
	setLoopProcs()
}

func setLoopProcs() {
	if n := loopProcs.base + min(loopProcs.loops, maxLoopProcs); runtime.GOMAXPROCS(0) != n {
		runtime.GOMAXPROCS(n)
	}
}
