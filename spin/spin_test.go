package spin

import (
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTest(max time.Duration) (*Waiter, *clock, *Site) {
	c := &clock{t: time.Unix(1000, 0)}
	s := &Site{Name: "test"}
	w := New(max, s)
	w.now = c.now
	return w, c, s
}

// wait runs one wait whose event comes after d: caught by a poll if it
// comes within the spin budget, else after blocking (plus wake latency).
func wait(w *Waiter, c *clock, d, wake time.Duration) bool {
	start, until := w.Start()
	if !until.IsZero() && d < until.Sub(start) {
		c.t = start.Add(d)
		w.Done(start, until, true)
		return true
	}
	c.t = start.Add(d + wake)
	w.Done(start, until, false)
	return false
}

func TestFastEventsKeepSpinning(t *testing.T) {
	w, c, s := newTest(50 * time.Microsecond)
	for range 1000 {
		if !wait(w, c, 20*time.Microsecond, 30*time.Microsecond) {
			t.Fatal("an event 20 µs after the last was not caught with a 50 µs budget")
		}
	}
	st := s.Stats()
	if st.Hits != 1000 || st.Misses != 0 || st.Spun != 1000*20*time.Microsecond {
		t.Fatalf("stats %+v", st)
	}
}

func TestIdleStopsSpinning(t *testing.T) {
	w, c, s := newTest(50 * time.Microsecond)
	spins := 0
	for i := range 20 {
		if w.Budget() > 0 {
			spins++
		}
		wait(w, c, time.Second, 30*time.Microsecond) // idle: events a second apart
		if i > 5 && w.Budget() != 0 {
			t.Fatalf("still spinning %v after %d idle waits", w.Budget(), i+1)
		}
	}
	if st := s.Stats(); st.Misses != uint64(spins) || st.Spun > 150*time.Microsecond {
		t.Fatalf("idle waits spun %v in %d misses (%d spins)", st.Spun, st.Misses, spins)
	}
}

// Events that come steadily, but after the budget (a memory server's
// requests, one per fault, 100 µs apart): a spin would miss every one, so
// the thread stops spinning after three and blocks from then on.
func TestLateEventsStopSpinning(t *testing.T) {
	w, c, s := newTest(50 * time.Microsecond)
	for i := range 100 {
		wait(w, c, 100*time.Microsecond, 30*time.Microsecond)
		if i >= 2 && w.Budget() != 0 {
			t.Fatalf("still spinning %v after %d events that came after the budget", w.Budget(), i+1)
		}
	}
	if st := s.Stats(); st.Misses != 3 || st.Spun != 150*time.Microsecond {
		t.Fatalf("stats %+v", st)
	}
}

func TestSpinningComesBack(t *testing.T) {
	w, c, _ := newTest(50 * time.Microsecond)
	for range 10 {
		wait(w, c, time.Second, 30*time.Microsecond)
	}
	if w.Budget() != 0 {
		t.Fatalf("budget %v after idling", w.Budget())
	}
	// Events come every 10 µs again: blocked waits end within 1.5x the
	// maximum (wake latency included), which brings spinning back from
	// the third.
	caught := 0
	for range 10 {
		if wait(w, c, 10*time.Microsecond, 30*time.Microsecond) {
			caught++
		}
	}
	if caught != 7 || w.Budget() != 50*time.Microsecond {
		t.Fatalf("%d of 10 fast events caught, budget %v", caught, w.Budget())
	}
}

func TestNeverSpinsWithZeroMax(t *testing.T) {
	w, c, s := newTest(0)
	for range 10 {
		if wait(w, c, time.Microsecond, 30*time.Microsecond) {
			t.Fatal("spun with max 0")
		}
	}
	if st := s.Stats(); st.Spun != 0 || st.Hits+st.Misses != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestNilSite(t *testing.T) {
	w := New(time.Millisecond, nil)
	start, until := w.Start()
	w.Done(start, until, true) // counts nowhere, does not panic
}
