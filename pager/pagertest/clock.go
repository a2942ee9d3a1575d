package pagertest

import (
	"sync"
	"time"
)

// Clock is a fake clock for an agent's decisions (pager.Options.Now: how
// long a fault has waited, when evictions resume, when a process is
// probed): it moves only when a test moves it, so that what the agent
// decides by the time does not depend on how fast the test runs. After
// Advance, the test wakes the agent's loops (the agent's WakeForTest) for
// them to decide at the new time.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at a fixed date (never the zero time, which
// the agent takes for "not set").
func NewClock() *Clock { return &Clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
