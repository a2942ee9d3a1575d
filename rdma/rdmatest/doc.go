// Package rdmatest provides the in-memory rdma provider ("mem") for the unit
// tests of other packages, and RunConformance, the test suite every rdma
// provider must pass.
//
// The mem provider executes each op synchronously inside Post, against a
// Domain in the same process, through the same Session checks as the real
// servers (keys, bounds, permissions, revocation). It is for tests, not for
// production: it has no wire format and no asynchrony. Listener.Break
// simulates a transport failure.
package rdmatest
