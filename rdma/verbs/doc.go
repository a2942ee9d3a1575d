// Package verbs is the rdma provider over libibverbs (rdma-core): real
// one-sided RDMA READ, WRITE, COMPARE_AND_SWAP and FETCH_ADD on an RC queue
// pair, on InfiniBand or RoCE hardware or on Soft-RoCE (rdma_rxe). Import it
// for its side effect; Dial and Listen it as "verbs" with a TCP address
// ("10.0.0.2:7472"), which carries the out-of-band control exchange.
//
// It is cgo and needs the build tag: go build -tags verbs (and
// libibverbs-dev). Without the tag the package registers a "verbs" provider
// whose Dial and Listen fail with ErrNotBuilt, one line naming the tag; with
// it but without a device they fail with an error wrapping ErrNoDevice that
// gives libibverbs' reason.
//
// # How the rdma API maps onto verbs
//
//	Device          the device and port whose GID is the control
//	                connection's local IP (RoCE; GID index 1 on rxe), else
//	                the first active InfiniBand port; Config or
//	                RMEM_VERBS_DEVICE / _PORT / _GID_INDEX override
//	Conn            one RC QP, one CQ with a completion channel, a PD, and a
//	                registered bounce arena (READ/WRITE staging ring plus
//	                one 8-byte atomic result per slot)
//	Post            one ibv_post_send per batch; only the last WR is
//	                signalled (RC completes in order, so its completion
//	                covers the unsignalled ones before it)
//	Poll/Wait       ibv_poll_cq in batches of up to 64; Wait sleeps on the
//	                completion channel and the control socket
//	Key             resolved once per connection: the client presents the
//	                rmem key over the control connection; the server checks
//	                it with Session.Map and registers one MR for the key's
//	                range, in a PD of that connection only, and hands back
//	                (rkey, addr, len, access)
//	Revoke          the Fence hook deregisters the MR (ibv_dereg_mr)
//
// # The rmem key stays the authority
//
// A verbs rkey is 32 bits and guessable, so it is never the capability:
// each client connection has its own protection domain, and an MR is
// registered in it only after that client presented a valid rmem key. A
// client can therefore reach only ranges it holds keys for. Memory windows
// (type 2) would give the same per-key invalidation; one MR per (connection,
// key) was chosen because it needs no server-side posting and is supported
// everywhere. The price: one ibv_reg_mr (pinning the range) per key and
// connection, and the server maps each key's range of the region's memfd a
// second time to register it, so a region made with rdma.NewRegion (no
// memfd) cannot be served over verbs (its keys answer StatusUnknownKey).
//
// # Errors and what stays usable
//
// Verbs has no per-request error that leaves an RC QP usable: a bad rkey or
// a range error moves both QPs to the error state. So the client checks
// every request against what it knows of the key (rights, bounds, atomic
// alignment) and completes failures itself, in order, without touching the
// QP. The one error it cannot foresee is a key revoked since it resolved
// it: that request fails on the device with a remote access error; the
// client asks the server, which answers revoked, completes the request with
// StatusRevokedKey, replaces the QP on both sides (RECONNECT) and posts the
// requests that were flushed behind it again. Any other device error
// (retry exceeded, a dead peer) and the end of the control connection are a
// transport failure: outstanding requests complete with StatusTransport.
//
// # Revocation guarantee, compared with tcp
//
// The server executes no op itself, so it cannot count ops in flight as
// tcp does. Revoke calls the Fence hook of every connection that resolved
// the key; it deregisters the MR, and ibv_dereg_mr returns once the device
// no longer accesses the memory (rxe: after the packets holding a
// reference to the MR are done). After Revoke returns, a request with the
// old rkey fails with a remote access error and moves nothing; a WRITE
// that the device was executing when deregistration began may have landed
// before it returned. That is the same guarantee as tcp (ops before Revoke
// returns may land; none after), given by the device instead of a pin
// count; there is no RevokeGrace and no connection is aborted.
//
// # What it is not
//
// Not a path for SEND/RECV messaging, and not zero-copy for arbitrary
// buffers: a request's Local buffer is copied through the registered bounce
// arena (about 1 µs per 4 KiB page) unless it lies in memory registered
// with LocalRegistrar.RegisterLocal (the pager's buffer pool), which the
// device then reads and writes directly. Not fork-safe: do not fork with
// open connections.
//
// # Concurrency and deadlocks
//
// A Conn is guarded by one mutex; Post, Poll and Wait are safe for
// concurrent use and start no goroutine. Post may block: for a control
// round trip the first time a key is used (bounded by a 10 s deadline), and
// while the bounce arena is full (it reaps completions itself, so it cannot
// wait on a caller that does not poll). Poll may make a control round trip
// after a revoked key broke the QP. Wait releases the mutex while asleep.
// The listener runs one accept goroutine and one goroutine per connection
// (the control exchange); Close closes them and waits. Lock order:
// session.mu, then the Domain's lock (Session.Map is called under
// session.mu; Fence takes session.mu with no Domain lock held).
package verbs
