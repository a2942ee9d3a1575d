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
	// learnShare: a rise with the CLOCK's hot pages (Clock.Hot) under
	// this share of the resident ones is the hand learning, not the edge
	// of the hot set (the hand keeps hot pages to hotPercent of the
	// resident ones: at the edge they are all of them but that).
	learnShare = 0.9
	// maxLearns is how many learning rises a phase gets before its rises
	// back off as at the edge: enough for the hand to get past a hot set
	// ahead of cold pages (w3-3's 48 MiB took 5-6 probes of ~2k pages),
	// few enough that a program with no cold pages to find (Redis's GETs
	// over every key: each probe's pages come back, and the agent's and
	// memd's work for it slows the server more than its misses show)
	// pays for them once, not all the time (probing every 2-10 s, its
	// Zipfian GETs fell to 0.85-0.94x all-local's).
	maxLearns = 8
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
	rising    bool      // the last step was a rise
	learns    int       // learning rises in this phase (maxLearns)
	learnedAt time.Time // the last step of a learning rise
	learnRise bool      // the last step was one (and so a rise)
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
// summed), its resident pages and how many of them the CLOCK knows are hot
// (Clock.Hot) at now, and returns its budget until the next step.
//
// A rise is one of two kinds. With nearly every resident page known hot,
// eviction had to take pages of the hot set: the budget is at its edge (the
// knee), probed less and less often (the hold doubles). With many pages
// not known hot, the hand took pages it had not yet seen come back, and
// they did (they are hot from now on): the hand is learning. The budget
// grows back to stop the misses, but the knee stays where it was and the
// hold is the shortest, so that the next probe goes on where the hand
// stopped; maxLearns such rises a phase. Before, a program whose hot pages
// the hand met before its cold ones backed off as if each probe had found
// the edge (w3-3's 48 MiB read at random ahead of 48 MiB written once:
// probes 5-33 s apart, ~2k misses each, never past the hot half in 90 s).
func (s *slowdown) step(now time.Time, stall time.Duration, resident, hot int) int {
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
	rising, learnRise := s.rising, s.learnRise
	s.rising, s.learnRise = false, false // unless this step rises too
	slack := max(min(s.budget, resident)/16, 2*budgetMargin)
	binding := resident >= s.budget-slack
	rose := frac > s.target && binding
	learn := rose && s.learning(now, learnRise, hot, resident)
	switch {
	case learn:
		// Learning: grow, hold the shortest, the knee unmoved.
		s.rising, s.learnRise = true, true
		if h := now.Add(minHold); h.After(s.holdUntil) {
			s.holdUntil = h
		}
		s.grow(frac)
	case rose:
		switch {
		case rising: // the same rise, a step on: the hold stays
		case !s.lastRise.IsZero() && now.Sub(s.lastRise) < 2*maxHold:
			s.hold = min(2*s.hold, maxHold)
		default:
			s.hold = minHold
		}
		s.rising = true
		s.lastRise, s.holdUntil, s.knee = now, now.Add(s.hold), s.budget
		s.grow(frac)
	case frac > s.target/2 || s.smooth > s.target/2:
		// Near the target, or misses of pages coming back: hold.
	case now.Before(s.holdUntil):
	default:
		s.shrink(resident, slack)
	}
	return s.budget
}

// learning reports whether a rise at now (same: the last step was a
// learning rise) with hot of the resident pages known hot is the hand
// learning, and counts it against the phase's maxLearns. A phase begins
// with a rise 2*maxHold after the last rise, as the hold's does.
func (s *slowdown) learning(now time.Time, same bool, hot, resident int) bool {
	if float64(hot) >= learnShare*float64(resident) {
		return false
	}
	if same {
		s.learnedAt = now
		return true // the same rise, a step on
	}
	last := s.lastRise
	if s.learnedAt.After(last) {
		last = s.learnedAt
	}
	if !last.IsZero() && now.Sub(last) >= 2*maxHold {
		s.learns = 0
	}
	if s.learns >= maxLearns {
		return false
	}
	s.learns++
	s.learnedAt = now
	return true
}

// grow gives back growFrac of the budget (growFast when the stall frac is
// 4x the target) after a rise, up to the ceiling.
func (s *slowdown) grow(frac float64) {
	g := growFrac
	if frac > 4*s.target {
		g = growFast
	}
	add := max(int(float64(s.budget)*g), budgetMargin)
	s.gain = frac / float64(add)
	s.budget = min(s.budget+add, s.ceiling)
}

// shrink takes a step off the budget (shrinkFrac, nearFrac near the knee)
// from what is resident plus slack when that is less.
func (s *slowdown) shrink(resident, slack int) {
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
