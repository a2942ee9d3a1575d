package pager

import (
	"testing"
	"time"
)

// program is a synthetic program for the slowdown controller: total pages
// of which hot are read all the time; below hot pages resident its stall
// rises steeply (each page short is a miss per pass over the hot set). The
// CLOCK knows its hot pages (Clock.Hot): those resident.
type program struct {
	hot, total int
	cold       float64 // stall of pages coming back, whatever the budget (fraction)
}

// stallAt is the program's stall fraction with budget pages.
func (p program) stallAt(budget int) float64 {
	s := p.cold
	if budget < p.hot {
		s += min(1, 50*float64(p.hot-budget)/float64(p.hot))
	}
	return min(s, 1)
}

// run steps s for d from t at steerPeriod with p's stall and returns the
// time at the end, the number of steps over the target, and the steps.
type trace struct {
	t       time.Time
	stall   time.Duration
	over    int
	rises   int
	budgets []int
}

func (tr *trace) run(t *testing.T, s *slowdown, p program, d time.Duration) {
	t.Helper()
	budget := s.budget
	for end := tr.t.Add(d); tr.t.Before(end); {
		f := p.stallAt(budget)
		if f > s.target {
			tr.over++
		}
		tr.t = tr.t.Add(steerPeriod)
		tr.stall += time.Duration(f * float64(steerPeriod))
		knee := s.lastRise
		resident := min(budget, p.total)
		budget = s.step(tr.t, tr.stall, resident, min(p.hot, resident))
		if s.lastRise != knee {
			tr.rises++
		}
		if budget > s.ceiling || budget < s.floor {
			t.Fatalf("budget %d outside [%d, %d]", budget, s.floor, s.ceiling)
		}
		tr.budgets = append(tr.budgets, budget)
	}
}

func newTrace() *trace { return &trace{t: time.Unix(1000, 0)} }

func TestSlowdownShrinksWhileUnderTarget(t *testing.T) {
	s := newSlowdown(0.02, 1<<20, 16)
	tr := newTrace()
	tr.run(t, s, program{hot: 0, total: 100000}, 60*time.Second)
	prev := 1 << 20
	for i, b := range tr.budgets {
		if b > prev {
			t.Fatalf("step %d: budget grew %d -> %d with no stall", i, prev, b)
		}
		prev = b
	}
	if prev != 16 {
		t.Fatalf("budget %d after 60 s without a stall, want the floor", prev)
	}
	// A budget far above what is resident starts from the resident pages
	// (and the slack eviction's watermarks leave under a budget).
	if tr.budgets[1] > 100000*17/16 {
		t.Fatalf("second step's budget %d: want it near the resident pages", tr.budgets[1])
	}
}

func TestSlowdownConverges(t *testing.T) {
	// The acceptance check's program: 48 MiB hot, 240 MiB written once.
	p := program{hot: 12288, total: 73728}
	s := newSlowdown(0.02, 6<<20, 16)
	tr := newTrace()
	tr.run(t, s, p, 50*time.Second)
	last := tr.budgets[len(tr.budgets)-1]
	if last < p.hot || last > 2*p.hot {
		t.Fatalf("budget %d pages after 50 s, want within [%d, %d]", last, p.hot, 2*p.hot)
	}
	// The last 10 s: the stall under the target on average.
	over, stall := tr.over, tr.stall
	tr.run(t, s, p, 10*time.Second)
	if f := float64(tr.stall-stall) / float64(10*time.Second); f > 0.02 {
		t.Fatalf("stall %.3f over the last 10 s, want at most the target (steps over it: %d)", f, tr.over-over)
	}
	// Ten minutes on: no blowup. Probes of the cliff get rarer (the hold
	// doubles up to maxHold), and the stall stays under the target.
	over, stall, rises := tr.over, tr.stall, tr.rises
	tr.run(t, s, p, 10*time.Minute)
	if f := float64(tr.stall-stall) / float64(10*time.Minute); f > 0.02 {
		t.Fatalf("stall %.3f over ten minutes, want at most the target", f)
	}
	if r := tr.rises - rises; r > 10*60/int(maxHold/time.Second)+2 {
		t.Fatalf("%d rises in ten minutes (steps over the target %d): the hold does not back off", r, tr.over-over)
	}
	for _, b := range tr.budgets[len(tr.budgets)-int(10*time.Second/steerPeriod):] {
		if b > 2*p.hot {
			t.Fatalf("budget %d pages in the last 10 s, want under %d", b, 2*p.hot)
		}
	}
}

func TestSlowdownGrowsBackFast(t *testing.T) {
	p := program{hot: 12288, total: 73728}
	s := newSlowdown(0.02, 6<<20, 16)
	tr := newTrace()
	tr.run(t, s, p, 60*time.Second)
	p.hot *= 2 // the hot set grows
	tr.budgets = tr.budgets[:0]
	tr.run(t, s, p, 2*time.Second)
	if b := tr.budgets[len(tr.budgets)-1]; b < p.hot {
		t.Fatalf("budget %d pages 2 s after the hot set grew to %d", b, p.hot)
	}
	stall := tr.stall
	tr.run(t, s, p, 20*time.Second)
	if f := float64(tr.stall-stall) / float64(20*time.Second); f > 0.02 {
		t.Fatalf("stall %.3f over the 20 s after, want at most the target", f)
	}
}

func TestSlowdownCeiling(t *testing.T) {
	p := program{hot: 50000, total: 60000} // needs more than it may have
	s := newSlowdown(0.02, 20000, 16)
	tr := newTrace()
	tr.run(t, s, p, 30*time.Second) // run fails on a budget over the ceiling
	if b := tr.budgets[len(tr.budgets)-1]; b != 20000 {
		t.Fatalf("budget %d, want the ceiling 20000 for a program stalled at it", b)
	}
}

func TestSlowdownColdMissesDoNotGrow(t *testing.T) {
	// Stalled while well under its budget: pages coming back, not the
	// budget's doing. The budget holds (no shrinking, no growing).
	s := newSlowdown(0.02, 100000, 16)
	tr := newTrace()
	s.budget = 50000
	tr.run(t, s, program{hot: 0, total: 10000, cold: 0.3}, 5*time.Second)
	for _, b := range tr.budgets {
		if b != 50000 {
			t.Fatalf("budget %d, want 50000 held", b)
		}
	}
}

func TestShareNode(t *testing.T) {
	for _, tc := range []struct {
		name        string
		wants       []int
		gains       []float64
		node, floor int
		check       func([]int) bool
	}{
		{"fits", []int{100, 200}, []float64{0, 0}, 1000, 16, func(b []int) bool { return b[0] == 100 && b[1] == 200 }},
		{"least gain gives", []int{5000, 5000}, []float64{1e-3, 1e-6}, 6000, 16,
			func(b []int) bool { return b[0] == 5000 && b[1] == 1000 }},
		{"unknown gains even out", []int{8000, 2000}, []float64{0, 0}, 6000, 16,
			func(b []int) bool { return b[0]+b[1] <= 6000 && b[0] <= 4100 && b[1] == 2000 }},
		{"floor holds", []int{5000, 5000}, []float64{0, 0}, 10, 16, func(b []int) bool { return b[0] == 16 && b[1] == 16 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := shareNode(tc.wants, tc.gains, tc.node, tc.floor)
			if !tc.check(b) {
				t.Fatalf("budgets %v", b)
			}
		})
	}
}

func TestSlowdownOneRiseOneHold(t *testing.T) {
	// A rise that lasts several steps (the budget growing to a hot set
	// much bigger than it) is one rise: its hold does not double each step.
	s := newSlowdown(0.02, 1<<20, 16)
	s.budget = 1000
	tr := newTrace()
	tr.run(t, s, program{hot: 100000, total: 200000}, 2*time.Second)
	if tr.rises < 3 {
		t.Fatalf("%d rising steps, want several", tr.rises)
	}
	if s.hold != minHold {
		t.Fatalf("hold %v after one rise of %d steps, want %v", s.hold, tr.rises, minHold)
	}
}

func TestSlowdownLearningDoesNotBackOff(t *testing.T) {
	// w3-3's program as the CLOCK hand first meets it: 192 MiB written
	// once, then 48 MiB read at random that the hand has not seen come
	// back yet, then 48 MiB written once. Each hot page the hand takes
	// faults back at once (a miss of 40 µs: 2,500 a step at most, the
	// program doing nothing else) and is known from then on, and while the
	// budget binds the hand goes on to the next one. With most resident
	// pages not known hot those rises are learning: the hold stays the
	// shortest, and the budget gets past the hot pages to the cold ones
	// behind them. Only at the hot set are the resident pages all known
	// hot.
	const cold, hot, behind, miss = 49152, 12288, 12288, 40 * time.Microsecond
	s := newSlowdown(0.02, 6<<20, 16)
	now := time.Unix(1000, 0)
	var stall time.Duration
	offCold, learnt, offBehind := 0, 0, 0
	resident := func() int { return cold - offCold + hot + behind - offBehind }
	budget := s.budget
	const d = 120 * time.Second
	for i := 0; i < int(d/steerPeriod); i++ {
		need := resident() - budget
		if need > 0 {
			n := min(need, cold-offCold)
			offCold += n
			need -= n
		}
		if need > 0 && learnt < hot {
			n := min(hot-learnt, int(steerPeriod/miss))
			learnt += n
			stall += time.Duration(n) * miss
			if learnt < hot {
				need = 0 // they came back: the hand goes on with them next step
			}
		}
		if need > 0 {
			n := min(need, behind-offBehind)
			offBehind += n
			need -= n
		}
		if need > 0 { // under the hot set: known hot pages go, and come back
			stall += time.Duration(min(need, int(steerPeriod/miss))) * miss
		}
		now = now.Add(steerPeriod)
		budget = s.step(now, stall, min(resident(), budget), learnt)
		if offBehind < behind && s.hold > minHold {
			t.Fatalf("step %d: hold %v before the edge of the hot set (learnt %d of %d hot pages, budget %d, resident %d)", i, s.hold, learnt, hot, budget, resident())
		}
	}
	if r := resident(); r > hot+hot/4 || learnt < hot {
		t.Fatalf("after %v: %d pages resident, %d of %d hot pages learnt: the cold pages behind the hot ones are not offloaded", d, r, learnt, hot)
	}
	if f := float64(stall) / float64(d); f > s.target {
		t.Fatalf("stall %.3f over %v, want at most the target", f, d)
	}
}

func TestSlowdownLearnsOncePerPhase(t *testing.T) {
	// A program with no cold pages to find (Redis's GETs over every key):
	// every page taken comes back, the CLOCK knows none hot (the hand
	// never finishes a turn). Its first maxLearns rises are learning; then
	// the hold backs off as at the edge, and over ten minutes the stall
	// stays under the target.
	const total = 70000
	s := newSlowdown(0.05, 1<<20, 16)
	now := time.Unix(1000, 0)
	var stall time.Duration
	budget, rises := s.budget, 0
	for i := 0; i < int(10*time.Minute/steerPeriod); i++ {
		f := 0.0
		if budget < total {
			f = min(1, float64(total-budget)*4e-4) // 1 MiB short: 10%
		}
		stall += time.Duration(f * float64(steerPeriod))
		now = now.Add(steerPeriod)
		prev := budget
		budget = s.step(now, stall, min(budget, total), 0)
		if budget > prev {
			rises++
		}
	}
	if s.learns != maxLearns {
		t.Fatalf("%d learning rises, want %d", s.learns, maxLearns)
	}
	if want := maxLearns + 10*60/int(maxHold/time.Second) + 3; rises > want {
		t.Fatalf("%d rises in ten minutes, want at most %d: learning does not stop", rises, want)
	}
	if f := float64(stall) / float64(10*time.Minute); f > s.target {
		t.Fatalf("stall %.3f over ten minutes, want at most the target", f)
	}
}
