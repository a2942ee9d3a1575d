// Package spin decides how long a thread waiting for its next event polls
// before it blocks, and counts what that costs.
//
// On these machines an idle vCPU halts at once (cpuidle haltpoll with
// guest_halt_poll_ns 0), and waking a thread blocked on a halted vCPU takes
// tens of µs; a remote fault passes through several such threads (the
// agent's loop, the transport's reader, the memory server's). A thread that
// polls for a short while after each event catches the next one without a
// wake-up while events come fast, and blocks as before when they stop: an
// idle node burns at most one budget per idle period.
//
// The budget adapts to how fast events come: a thread spins while most of
// its recent events came soon enough for a spin to catch them, within the
// maximum (or, for a wait that blocked, within 1.5 times the maximum: a
// blocked wait includes the wake-up), and blocks at once otherwise. A
// spin that misses is CPU taken from the program and the other threads of
// the fault path, which on a machine of two vCPUs is what the fault path
// runs short of: a memory server whose requests come 100 µs apart, one per
// fault, must not poll 50 µs for each (measured on a 2-vCPU PVM guest: 262k
// random reads over tcp 25-27 s with such polling, 22 s without). An idle
// thread spins three times, then blocks; one whose events come fast again
// spins from the third that does.
//
// A polling thread gives its CPU away at each look (Polling calls
// sched_yield(2)): on two vCPUs the fault path has more threads that poll
// (the agent's loop, the transport's reader, the memory server's, a
// faulting thread of ring mode) than CPUs, and a thread whose event came
// waited for the one polling on its CPU to end its spin. Measured on this
// machine kind (2026-12-06, one session, old/new): random reads over tcp
// in ring mode 47-68 µs a miss, 31-40 µs; in the kernel's path 23-41 and
// 25-34 µs; Redis GETs over tcp in ring mode 11.2-13.6k/s, 16.3-17.0k/s,
// in the kernel's path 10.8-13.1k/s, 13.7-14.6k/s; over shm unchanged.
// When nothing else is runnable there, the yield returns at once.
//
// It is not a scheduler or a CPU governor: it changes nothing on the host
// (guest_halt_poll_ns stays as the operator set it). It keeps no
// process-wide state and knows nothing of metrics: the daemons own the
// Sites and export them (internal/spinmetrics).
package spin

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultMax is the longest spin when a caller sets none: about the time
// of two wake-ups of a halted vCPU on these VMs.
const DefaultMax = 50 * time.Microsecond

// Resolve turns an option's value into a maximum: 0 means DefaultMax, a
// negative value never spinning.
func Resolve(opt time.Duration) time.Duration {
	switch {
	case opt == 0:
		return DefaultMax
	case opt < 0:
		return 0
	}
	return opt
}

// Waiter is one waiting thread's spin state. It is not safe for concurrent
// use: each waiting thread has its own.
type Waiter struct {
	max    time.Duration
	budget time.Duration
	// soon estimates, in 1/256ths, how many of the recent events came
	// soon enough to be caught (a running average, each event a quarter).
	soon int
	site *Site
	now  func() time.Time
}

// Site counts the spinning of every Waiter of one kind of thread (the
// agent's loops, a transport's readers): for metrics and reports. The
// daemon that assembles the parts makes its sites (&Site{Name: …}), hands
// each to the parts whose threads wait (rdma.DialOptions.SpinSite,
// pager.Options.SpinSite, …) and exports them; a nil *Site counts nowhere.
type Site struct {
	Name   string
	spun   atomic.Int64 // ns spent polling
	hits   atomic.Uint64
	misses atomic.Uint64
}

// SiteStats is what a Site counted.
type SiteStats struct {
	Name string `json:"site"`
	// Spun is the CPU time spent polling: the price of spinning.
	Spun time.Duration `json:"spun_ns"`
	// Hits are waits a poll ended (a wake-up saved); Misses are spins
	// that ran out and blocked after all.
	Hits   uint64 `json:"hits"`
	Misses uint64 `json:"misses"`
}

// Stats returns what s counted.
func (s *Site) Stats() SiteStats {
	return SiteStats{Name: s.Name, Spun: time.Duration(s.spun.Load()), Hits: s.hits.Load(), Misses: s.misses.Load()}
}

// New returns a Waiter that spins at most max (0: never) and counts into
// site (nil: nowhere).
func New(max time.Duration, site *Site) *Waiter {
	if max < 0 {
		max = 0
	}
	return &Waiter{max: max, budget: max, soon: 256, site: site, now: time.Now}
}

// Start begins a wait. It returns when the wait began and until when to
// poll before blocking (zero: do not poll).
func (w *Waiter) Start() (start, until time.Time) {
	start = w.now()
	if w.budget <= 0 {
		return start, time.Time{}
	}
	return start, start.Add(w.budget)
}

// Polling reports whether a wait that Start gave until may poll again,
// after it has given the CPU to another thread runnable on it, if any.
func (w *Waiter) Polling(until time.Time) bool {
	if until.IsZero() || !w.now().Before(until) {
		return false
	}
	unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	return true
}

// Done ends the wait Start began at start with spin deadline until; hit
// says whether a poll ended it (else the caller blocked).
func (w *Waiter) Done(start, until time.Time, hit bool) {
	now := w.now()
	waited := now.Sub(start)
	if !until.IsZero() {
		spun := min(waited, until.Sub(start))
		if w.site != nil {
			w.site.spun.Add(int64(spun))
			if hit {
				w.site.hits.Add(1)
			} else {
				w.site.misses.Add(1)
			}
		}
	}
	soon := 0
	if hit || until.IsZero() && waited < w.max+w.max/2 {
		soon = 256
	}
	w.soon += (soon - w.soon) / 4
	w.budget = 0
	if w.soon >= 128 && w.max > 0 {
		w.budget = w.max
	}
}

// Budget returns the spin budget of the next wait.
func (w *Waiter) Budget() time.Duration { return w.budget }
