// Package shm is the same-host rdma provider: the client maps the server's
// memory and executes READ, WRITE and atomics itself, with no server CPU,
// as a one-sided RDMA op would.
//
// Importing it registers the provider "shm" with rdma.Dial and rdma.Listen;
// the address is a unix socket path (e.g. /run/rmem/memd-shm.sock).
//
// # How it works
//
// The Listener accepts SOCK_SEQPACKET connections. Each connection gets a
// control memfd (64 KiB) shared by server and client: word 0 says whether
// the connection is live, and each key the client maps has a slot of two
// words, state (server-written: valid, revoked) and inflight
// (client-written). The first time a client uses a key it sends MAP; the
// server checks the key in the Domain and answers with the range, the
// access and a slot, passing the region's memfd with SCM_RIGHTS. The client
// maps the key's range MAP_SHARED (PROT_READ only for a read-only key) and
// from then on every op is a bounds check and a copy or a sync/atomic op in
// the client's goroutine, inside Post. Only regions from rdma.AllocRegion
// (memfd-backed) can be served.
//
// # Revocation: what is guaranteed
//
// An op in the client runs as: store inflight=1; load the connection word
// and the slot state; if both are good, do the copy or atomic; store
// inflight=0. Domain.Revoke calls the connection's fence, which stores
// state=revoked and then waits for inflight==0. The stores and loads are
// sequentially consistent atomics on shared memory (a Dekker handshake),
// so either the op saw the revocation and did nothing, or the fence waits
// until the op finished. Hence, when Revoke returns nil, no op of any shm
// client with that key is running or can start, and the memory server may
// zero the slab. The fence also ends when the client process has exited
// (pidfd) or has closed its connection (the client unmaps before closing).
// A client stopped inside an op (SIGSTOP, a debugger) stalls Revoke until
// its ctx ends; Revoke then fails with rdma.ErrRevokeIncomplete and the
// slab must not be reused.
//
// # What it is not
//
// Not a security boundary. The client receives the region's memfd, so a
// malicious process could map all of it; the key and bounds checks run in
// the client library. Serve shm only to trusted local daemons (the
// memagent, running as root) and protect the socket path with file
// permissions. A forked child of a client inherits its mappings outside
// this protocol: do not fork with open shm connections. Domain.Stats does
// not count shm ops (the server never sees them).
//
// # Failure
//
// Listener.Close marks every connection closed in its control memory (the
// next op fails with StatusTransport) and closes the sockets. If the server
// process dies, the client notices the socket closing and fails later
// Posts; an op racing with the death may still complete on the orphaned
// memory, which the client then drops.
//
// # Concurrency and deadlocks
//
// A Conn's Post runs the ops under the connection's mutex; Wait and Poll
// only read the completion ring. One goroutine per client connection reads
// the socket; the server runs one per connection and one per listener, all
// stopped by Close. Lock order on the server: serverConn.mu before the
// Domain's locks.
package shm

import (
	"context"

	"rmem/rdma"
)

// Network is the provider name.
const Network = "shm"

func init() { rdma.RegisterProvider(Network, provider{}) }

type provider struct{}

func (provider) Dial(ctx context.Context, addr string, opts rdma.DialOptions) (rdma.Conn, error) {
	return Dial(ctx, addr, opts)
}

func (provider) Listen(addr string, d *rdma.Domain, opts rdma.ListenOptions) (rdma.Listener, error) {
	return Listen(addr, d, opts)
}
