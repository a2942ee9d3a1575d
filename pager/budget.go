package pager

import "sync/atomic"

// budgetAsk is what sets a client's budget, read and written by the loop,
// the agent's goroutines and the steering routine. localMem is the budget
// its HELLO asked for (0: the agent's); maxSlowdown the slowdown target
// its HELLO asked for, millionths (0: the agent's, Options.MaxSlowdown);
// auto the budget in pages the steering routine gives it (0: a fixed
// budget, budgetPages), and stallFrac (float64 bits) its stall over the
// last step.
type budgetAsk struct {
	localMem    atomic.Uint64
	maxSlowdown atomic.Uint32
	auto        atomic.Int64
	stallFrac   atomic.Uint64
}

// budgetPages returns the budget of resident pages of c: the steering
// routine's when its budget is steered by a slowdown target, else the
// fixed one.
func (c *client) budgetPages() int {
	if b := c.bud.auto.Load(); b > 0 {
		return int(b)
	}
	return c.a.budgetPages(c.bud.localMem.Load())
}

// budgetPages returns the budget of resident pages of a client that asked
// for local bytes in its HELLO (0: LocalMem), or an even share of NodeMem
// if smaller.
func (a *Agent) budgetPages(local uint64) int {
	b := a.opts.LocalMem
	if local != 0 {
		b = local
	}
	if a.opts.NodeMem > 0 {
		b = min(b, a.opts.NodeMem/uint64(max(a.nclients.Load(), 1)))
	}
	return int(b / pageSize)
}
