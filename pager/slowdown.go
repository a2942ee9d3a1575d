package pager

import (
	"time"
)

// Budgets from a slowdown target (Options.MaxSlowdown; docs/pager.md,
// Budgets from a slowdown target): a plain controller per program, stepped
// by the agent's steering routine (steer.go) with the time and the
// program's stall so far as arguments; it reads no clock and starts no
// goroutine.

// Controller parameters. A step is a steerPeriod apart (the caller's
// ticks); the stall measured over one step steers the next.
const (
	// A short step is a short thrash when a probe finds the edge of a hot
	// set (a page short of random reads over it is a miss per pass: the
	// program stalls until the next step gives memory back).
	steerPeriod = 100 * time.Millisecond
	// shrinkFrac is the share of the budget a step takes away while the
	// stall is under half the target and nothing says to wait (15% a
	// second).
	shrinkFrac = 0.016
	// nearFrac is the step near the budget where the stall last rose
	// (within nearZone of it): the cliff of a hot set is found slowly (4%
	// a second).
	nearFrac = 0.004
	nearZone = 1.25 // near: within 25% of that budget, either side
	// growFrac and growFast: a step with the stall over the target adds
	// a quarter of the budget, half of it when the stall is 4x the target.
	growFrac = 0.25
	growFast = 0.5
	// minHold is how long a budget is held after the stall rose past the
	// target before shrinking again; each rise within maxHold*2 of the
	// last doubles it, up to maxHold (no oscillation blowup: a budget that
	// keeps finding the cliff probes it less and less often).
	minHold = 2 * time.Second
	maxHold = 32 * time.Second
	// stallPerFault is what the agent does not see of a miss it serves:
	// the trap, the wake-up of the thread and its resume (DESIGN.md: a
	// miss 21-24 µs as the program sees it over shm, the agent's share
	// 10-15 µs). It is added to each miss's measured latency.
	stallPerFault = 10 * time.Microsecond
)

// slowdown steers one program's budget of resident pages so that the time
// its threads spend in misses per second of wall time (its stall) stays
// under target: it starts with everything local (the ceiling), takes
// shrinkFrac of the budget a step while the stall is under half the
// target (the eviction that follows takes cold pages first: hot/cold
// CLOCK), and gives memory back (growFrac, growFast) as soon as the stall
// passes the target while the budget binds (the program is at it; a stall
// with the program well under its budget is of pages coming back, not of
// the budget: it only stops the shrinking). It never goes over ceiling or
// under floor.
type slowdown struct {
	target         float64 // stall fraction (0.02: 2%)
	ceiling, floor int     // pages

	budget    int           // pages
	started   bool          // last and lastStall are set
	last      time.Time     // the last step
	lastStall time.Duration // the program's stall so far at last
	stall     float64       // the stall fraction over the last step
	smooth    float64       // its moving average (weight 1/8 on each step)
	knee      int           // the budget where the stall last rose past the target (0: none yet)
	hold      time.Duration // the current hold (minHold..maxHold)
	holdUntil time.Time     // no shrinking before
	lastRise  time.Time
	rising    bool // the last step was a rise
	// gain is the stall fraction the last rise cost per page short of
	// what the program needed (how much it gains per page given back):
	// the node's memory goes first to programs that gain the most.
	gain float64
}

// newSlowdown returns a controller for target (a fraction) between floor
// and ceiling pages, starting at the ceiling.
func newSlowdown(target float64, ceiling, floor int) *slowdown {
	floor = min(floor, ceiling)
	return &slowdown{target: target, ceiling: ceiling, floor: floor, budget: ceiling, hold: minHold}
}

// step takes the program's stall so far (its threads' time in misses,
// summed) and resident pages at now, and returns its budget until the next
// step.
func (s *slowdown) step(now time.Time, stall time.Duration, resident int) int {
	if !s.started {
		s.started, s.last, s.lastStall = true, now, stall
		return s.budget
	}
	dt := now.Sub(s.last)
	if dt <= 0 {
		return s.budget
	}
	frac := float64(stall-s.lastStall) / float64(dt)
	s.last, s.lastStall = now, stall
	s.stall = frac
	s.smooth += (frac - s.smooth) / 8
	rising := s.rising
	s.rising = false // unless this step rises too
	slack := max(min(s.budget, resident)/16, 2*budgetMargin)
	binding := resident >= s.budget-slack
	switch {
	case frac > s.target && binding:
		switch {
		case rising: // the same rise, a step on: the hold stays
		case !s.lastRise.IsZero() && now.Sub(s.lastRise) < 2*maxHold:
			s.hold = min(2*s.hold, maxHold)
		default:
			s.hold = minHold
		}
		s.rising = true
		s.lastRise, s.holdUntil, s.knee = now, now.Add(s.hold), s.budget
		g := growFrac
		if frac > 4*s.target {
			g = growFast
		}
		add := max(int(float64(s.budget)*g), budgetMargin)
		s.gain = frac / float64(add)
		s.budget = min(s.budget+add, s.ceiling)
	case frac > s.target/2 || s.smooth > s.target/2:
		// Near the target, or misses of pages coming back: hold.
	case now.Before(s.holdUntil):
	default:
		base := min(s.budget, resident+slack) // a budget far above what is resident frees nothing
		f := shrinkFrac
		switch {
		case s.knee == 0:
		case float64(base)*nearZone < float64(s.knee):
			// Well under where the stall rose, and it has not risen
			// again: that rise was not the program's need (a hot set
			// that moved on, a first turn of the hand through it).
			s.knee = 0
		case float64(base) < nearZone*float64(s.knee):
			f = nearFrac
		}
		s.budget = max(base-max(int(float64(base)*f), budgetMargin), s.floor)
	}
	return s.budget
}

// shareNode fits the budgets wants (pages, one per program) into node
// pages, taking from the programs that gain least per page first (gains:
// the stall fraction a page given back saves, 0 when unknown: those give
// first), and returns the budgets. Each keeps at least floor pages. The
// result is in place of wants.
func shareNode(wants []int, gains []float64, node, floor int) []int {
	total := 0
	for _, w := range wants {
		total += w
	}
	for total > node {
		// The program with the least gain per page gives a step (an
		// eighth of the excess, at least a batch) down to floor.
		k := -1
		for i, w := range wants {
			if w > floor && (k < 0 || gains[i] < gains[k] || gains[i] == gains[k] && w > wants[k]) {
				k = i
			}
		}
		if k < 0 {
			break
		}
		cut := min(max((total-node)/8, budgetMargin), total-node, wants[k]-floor)
		wants[k] -= cut
		total -= cut
		gains[k] *= 1.0 + float64(cut)/float64(max(wants[k], 1)) // a program's gain rises as it shrinks
	}
	return wants
}
