// Package iovec reads from a connection into a list of buffers with one
// readv(2), so that payloads land directly in their destination (a
// registered region on the server, the caller's buffer on the client).
//
// It is not a general I/O library: it serves the rdma tcp provider's two
// read loops. Connections that expose no file descriptor (TLS) fall back to
// one Read per call into the first non-empty buffer, which still lands in
// the destination but copies through the TLS record buffer. A socket can
// be taken out of Go's netpoller (Detach) for a reader that waits on its
// own thread.
package iovec
