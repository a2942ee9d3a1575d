package pager

import (
	"context"
	"math"
	"time"
)

// The steering routine: every steerPeriod it steps the slowdown controller
// (slowdown.go) of each client whose budget a slowdown target sets, fits
// their budgets into NodeMem, and wakes the loops whose budget changed
// (they evict down to it, or let faults held at it go). The controllers
// are its own state; the clients see only their budget (client.bud.auto).

// steering is the routine's state: a controller per steered client, and
// its scratch slices.
type steering struct {
	ctl   map[uint64]*slowdown
	cs    []*client
	wants []int
	gains []float64
}

// RoutineSteer steers the budgets of the clients that have a slowdown
// target until ctx ends.
func (a *Agent) RoutineSteer(ctx context.Context) {
	t := time.NewTicker(steerPeriod)
	defer t.Stop()
	var st steering
	st.ctl = map[uint64]*slowdown{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.steer(&st, a.opts.Now())
		}
	}
}

// target returns c's slowdown target as a fraction (0: a fixed budget).
func (a *Agent) target(c *client) float64 {
	if m := c.bud.maxSlowdown.Load(); m != 0 {
		return float64(m) / 1e6
	}
	return a.opts.MaxSlowdown
}

// ceiling returns the most pages a steered client's budget may be: what
// its HELLO asked for, or else the agent's LocalMem, and at most NodeMem.
func (a *Agent) ceiling(c *client) int {
	b := a.opts.LocalMem
	if l := c.bud.localMem.Load(); l != 0 {
		b = l
	}
	if a.opts.NodeMem > 0 {
		b = min(b, a.opts.NodeMem)
	}
	return int(b / pageSize)
}

// steer is one step of every steered client at now.
func (a *Agent) steer(st *steering, now time.Time) {
	a.mu.Lock()
	st.cs = st.cs[:0]
	for _, c := range a.clients {
		st.cs = append(st.cs, c)
	}
	a.mu.Unlock()
	fixed := 0 // pages of the clients with a fixed budget
	k := 0
	st.wants, st.gains = st.wants[:0], st.gains[:0]
	seen := make(map[uint64]bool, len(st.cs))
	for _, c := range st.cs {
		target := a.target(c)
		if target <= 0 {
			c.bud.auto.Store(0)
			fixed += c.budgetPages()
			continue
		}
		seen[c.id] = true
		s := st.ctl[c.id]
		if s == nil {
			s = newSlowdown(target, a.ceiling(c), minLocalMem/pageSize)
			st.ctl[c.id] = s
		}
		want := s.step(now, time.Duration(c.st.stall.Load()), int(c.st.resident.Load()), int(c.st.hot.Load()))
		c.bud.stallFrac.Store(math.Float64bits(s.stall))
		st.cs[k] = c
		k++
		st.wants = append(st.wants, want)
		st.gains = append(st.gains, s.gain)
	}
	st.cs = st.cs[:k]
	for id := range st.ctl {
		if !seen[id] {
			delete(st.ctl, id) // gone, or its budget fixed now
		}
	}
	if a.opts.NodeMem > 0 {
		node := max(int(a.opts.NodeMem/pageSize)-fixed, 0)
		shareNode(st.wants, st.gains, node, minLocalMem/pageSize)
	}
	for i, c := range st.cs {
		b := st.wants[i]
		if s := st.ctl[c.id]; b < s.budget {
			s.budget = b // the node's share: the controller grows from there when the stall rises
		}
		if old := c.bud.auto.Swap(int64(b)); old != int64(b) {
			c.wake() // evict down to it now, not at the next fault; or let faults held at it go
		}
	}
}
