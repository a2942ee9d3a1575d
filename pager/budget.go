package pager

// budgetPages returns the budget of resident pages of c: the steering
// routine's when its budget is steered by a slowdown target, else the
// fixed one.
func (c *client) budgetPages() int {
	if b := c.auto.Load(); b > 0 {
		return int(b)
	}
	return c.a.budgetPages(c.localMem.Load())
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
