package pager

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
