// Package client is the Go client of the pool's HTTP/JSON control API
// (docs/api.md): the memd admin CLI, memory servers (register, heartbeat)
// and agents (leases, slabs, renewals) use it. Errors carry the server's
// message and wrap the matching pool sentinel (errors.Is(err,
// pool.ErrNotFound)), so callers handle them as if the coordinator were in
// process. MemServer is the coordinator's client of a memory server's
// control endpoint.
//
// It is not for policy: no retries beyond what a caller asks for, no caching.
// Every method takes a context; a Client is safe for concurrent use and
// starts no goroutines of its own (net/http's idle connections are closed by
// CloseIdleConnections).
package client
