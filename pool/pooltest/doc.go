// Package pooltest provides what tests of the pool and of its users need:
// without sockets or memory, a fake Clock moved by hand, and Servers, an
// in-memory set of memory servers that grant and revoke real random keys
// (implementing coord.Dialer and coord.SlabServer) with failure injection;
// and Live, a real pool in the test's process (a coordinator behind its
// HTTP API, memory servers with tcp data planes).
//
// It is not for production use.
package pooltest
