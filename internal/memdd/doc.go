// Package memdd assembles the memd daemon (`memd serve`): the control API
// listener and its token, the memory-server role (pool/memserver) with its
// tcp, shm and verbs data planes, the coordinator role (pool/coord) on its
// bbolt store, the Prometheus metrics, and the order in which they start and
// stop. cmd/memd reads and checks its flags into Options and calls Run.
//
// It holds no pool logic (package pool and its subpackages) and reads no
// flags, config files or environment (cmd/memd, internal/cli); it only wires
// the pieces and owns their lifetimes.
//
// Start and stop: the control API listens first, so that the memory server
// registers the real address (an ephemeral port in tests); with both roles
// in one process it serves only once this node's memory is in the pool. On
// the way out the memory server leaves the pool while the coordinator still
// runs, then the coordinator's sweep ends, then the HTTP server, the
// coordinator, its store and the memory server close in that order.
package memdd
