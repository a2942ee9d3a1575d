package coord

import "time"

// WaitFrees waits for the frees left running behind requests (freeLater),
// so that a test sees their outcome.
func (c *Coordinator) WaitFrees() { c.bg.Wait() }

// SweepPace is the pace RoutineSweep keeps (0: none runs).
func (c *Coordinator) SweepPace() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sweepEvery
}
