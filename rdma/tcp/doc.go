// Package tcp is the default rdma provider: software RDMA over TCP.
//
// Importing it registers the provider "tcp" with rdma.Dial and rdma.Listen.
// The wire format is a versioned binary framing (see wire.go): a hello each
// way, then fixed-size little-endian request and reply headers, with WRITE
// and READ payloads following their headers.
//
// The server executes each request against the Domain's registered memory
// with no allocation: a WRITE payload is read straight into the region (the
// part that arrived together with earlier headers is copied from the
// request buffer), and READ replies are written with writev straight from
// the region. Replies to pipelined requests are gathered into one writev.
// The client writes a batch of requests with one writev, and reads each
// READ's payload straight into the request's Local buffer with readv, so a
// 4 KiB page moves with no copy in user space on either side.
//
// TCP_NODELAY is set. TLS (crypto/tls) is used when DialOptions.TLS /
// ListenOptions.TLS are set; over TLS reads go through crypto/tls's record
// buffer (one copy) and writes are not vectored.
//
// It is not the verbs provider and gives no kernel bypass: every op costs
// the server a little CPU, unlike real one-sided RDMA.
//
// # Ordering and failure
//
// One connection is one TCP stream and one server goroutine: requests are
// executed and answered in order (RC semantics). A malformed frame (bad
// version, opcode, flags, oversize length) closes that connection only; a
// request that names a bad key or range gets an error reply and its WRITE
// payload is discarded, and the connection keeps working. When the stream
// breaks, the client completes every outstanding request with
// StatusTransport.
//
// # Concurrency and deadlocks
//
// Client: no goroutine of its own. Dialed with ThreadWait, its socket
// leaves Go's netpoller after the handshake (iovec.Detach): its reader
// polls the socket on its own thread, and a reply no longer also wakes the
// runtime's poller thread. Post writes under the connection's
// write lock; Wait and Poll read replies in the caller's goroutine under a
// reader token (one reader at a time; other waiters sleep until it hands
// over). When the socket is full, Post reads replies while it waits for
// room, so one goroutine that posts big READs and big WRITEs without
// waiting cannot deadlock against a server blocked on its replies (over
// TLS, writes block: keep batches within the socket buffers there). A
// server that stops answering blocks Wait until its ctx ends: use
// deadlines.
// Server: one goroutine per connection plus one accept goroutine per
// listener; Listener.Close stops them all and waits. A READ pins its key
// (rdma.Session.Begin) until its reply has been written, so a client that
// stops reading delays Domain.Revoke until RevokeGrace, when the Domain
// closes that connection.
package tcp

import (
	"context"

	"rmem/rdma"
)

// Network is the provider name.
const Network = "tcp"

func init() { rdma.RegisterProvider(Network, provider{}) }

type provider struct{}

func (provider) Dial(ctx context.Context, addr string, opts rdma.DialOptions) (rdma.Conn, error) {
	return Dial(ctx, addr, opts)
}

func (provider) Listen(addr string, d *rdma.Domain, opts rdma.ListenOptions) (rdma.Listener, error) {
	return Listen(addr, d, opts)
}
