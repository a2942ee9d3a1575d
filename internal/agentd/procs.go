package agentd

import (
	"runtime"
	"sync"
)

// Each client loop of the pager is a goroutine locked to its OS thread that spends its
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

// loopProcs sizes GOMAXPROCS by the running loops: pager.Options'
// LoopsChanged (called one at a time).
type loopProcs struct {
	mu    sync.Mutex
	base  int // GOMAXPROCS when no loop runs
	loops int
}

// changed is the pager's LoopsChanged: a P more per running loop; with
// none, GOMAXPROCS is what it was before the first.
func (lp *loopProcs) changed(running int) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.loops == 0 && running > 0 {
		lp.base = runtime.GOMAXPROCS(0)
	}
	lp.loops = running
	if n := lp.base + min(running, maxLoopProcs); lp.base > 0 && runtime.GOMAXPROCS(0) != n {
		runtime.GOMAXPROCS(n)
	}
}
