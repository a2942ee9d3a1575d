package rdma

import (
	"context"
	"crypto/tls"
	"fmt"
	"sort"
	"sync"
	"time"

	"rmem/spin"
)

// Conn is the client side of one connection to a memory server: a verbs RC
// queue pair with its send queue and completion queue.
//
// Contract (every provider):
//   - Post posts all of wrs or none. It returns ErrQueueFull (posting none)
//     when more than Depth requests would be outstanding; a request is
//     outstanding from Post until Poll or Wait returns its completion. It
//     returns ErrInvalidRequest (wrapped) for a request that fails
//     WorkRequest.Check, ErrClosed after Close, and ErrTransport (wrapped)
//     once the connection has failed; in those cases nothing was posted.
//   - Every posted request gets exactly one Completion. Completions come
//     back in posting order (RC ordering): the ops of one connection execute
//     and complete in order, so a READ after a WRITE to the same bytes sees
//     the WRITE.
//   - A per-request error (unknown or revoked key, out of bounds,
//     permission, misaligned atomic) is a Completion status; the connection
//     stays usable.
//   - A transport failure completes every outstanding request with
//     StatusTransport (the op may or may not have executed) and makes later
//     Posts fail; nothing hangs. Dial again to reconnect.
//   - Poll never blocks. Wait blocks until at least one completion is ready
//     or ctx is done; it returns ErrIdle at once when nothing is outstanding.
//   - Post, Poll and Wait are safe for concurrent use, but completions go to
//     whichever caller polls: give each thread its own Conn (one QP per
//     thread).
//   - Post, Poll and Wait do not allocate.
type Conn interface {
	Post(wrs []WorkRequest) error
	Poll(cqes []Completion) (int, error)
	Wait(ctx context.Context, cqes []Completion) (int, error)
	Close() error
}

// DefaultDepth is the queue depth used when DialOptions.Depth is zero.
const DefaultDepth = 128

// MaxDepth bounds DialOptions.Depth.
const MaxDepth = 4096

// DialOptions configure a client connection. The zero value is valid.
type DialOptions struct {
	// Depth is the maximum number of outstanding requests (0: DefaultDepth).
	Depth int
	// TLS, when set, wraps the connection in TLS (providers that cross
	// hosts: tcp). Providers that cannot use it ignore it.
	TLS *tls.Config
	// ThreadWait makes Wait block the calling OS thread in the kernel
	// rather than park the goroutine in Go's scheduler: for callers locked
	// to their thread (the pager's fault loops), where a park costs two
	// thread hand-offs. Over tcp the socket then leaves Go's netpoller
	// (it would wake the runtime's poller thread for every reply the
	// thread finds itself). Providers without a blocking wait ignore it.
	ThreadWait bool
	// Spin is how long a waiter for completions polls the connection
	// before it blocks, adapted to how fast they come (package spin):
	// 0 means spin.DefaultMax, a negative value never. Providers without
	// a blocking wait ignore it.
	Spin time.Duration
	// SpinSite, when set, counts that polling (the daemon exports it).
	SpinSite *spin.Site
}

// Validate checks the options, naming the bad field.
func (o DialOptions) Validate() error {
	if o.Depth < 0 || o.Depth > MaxDepth {
		return fmt.Errorf("rdma: DialOptions.Depth %d out of range [0, %d]", o.Depth, MaxDepth)
	}
	return nil
}

// QueueDepth returns the effective depth.
func (o DialOptions) QueueDepth() int {
	if o.Depth == 0 {
		return DefaultDepth
	}
	return o.Depth
}

// ListenOptions configure a server listener. The zero value is valid.
type ListenOptions struct {
	// TLS, when set, makes the listener require TLS (tcp).
	TLS *tls.Config
	// MaxConns bounds the connections served at once (0: unlimited); extra
	// connections are closed at accept.
	MaxConns int
	// Spin is how long a connection's server polls for the next request
	// before it blocks (as DialOptions.Spin). Providers whose server does
	// no work per op (shm, verbs) ignore it.
	Spin time.Duration
	// SpinSite, when set, counts that polling (as DialOptions.SpinSite).
	SpinSite *spin.Site
}

// Listener serves a Domain's memory to clients of one provider.
type Listener interface {
	// Addr is the address clients pass to Dial.
	Addr() string
	// Close stops accepting, closes every connection it serves (their
	// clients see a transport failure) and returns once all of its
	// goroutines have exited. It is safe to call twice.
	Close() error
}

// Provider is a transport implementation, registered by name.
type Provider interface {
	Dial(ctx context.Context, addr string, opts DialOptions) (Conn, error)
	Listen(addr string, d *Domain, opts ListenOptions) (Listener, error)
}

var (
	providersMu sync.RWMutex
	providers   = map[string]Provider{}
)

// RegisterProvider makes a provider available to Dial and Listen by name.
// Providers call it from init; it panics on a duplicate name.
func RegisterProvider(name string, p Provider) {
	providersMu.Lock()
	defer providersMu.Unlock()
	if _, dup := providers[name]; dup {
		panic("rdma: provider registered twice: " + name)
	}
	providers[name] = p
}

// Providers returns the registered provider names, sorted.
func Providers() []string {
	providersMu.RLock()
	defer providersMu.RUnlock()
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookup(network string) (Provider, error) {
	providersMu.RLock()
	p, ok := providers[network]
	providersMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q (import its package, e.g. rmem/rdma/tcp)", ErrUnknownProvider, network)
	}
	return p, nil
}

// Dial connects to a memory server with the named provider, e.g.
// Dial(ctx, "tcp", "10.0.0.2:7471", opts) or Dial(ctx, "shm",
// "/run/rmem/memd-shm.sock", opts). ctx bounds the connection handshake only.
func Dial(ctx context.Context, network, addr string, opts DialOptions) (Conn, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p, err := lookup(network)
	if err != nil {
		return nil, err
	}
	return p.Dial(ctx, addr, opts)
}

// DialN opens n independent connections to one peer (e.g. one per fault
// thread). On error it closes the ones it opened.
func DialN(ctx context.Context, network, addr string, n int, opts DialOptions) ([]Conn, error) {
	if n < 1 {
		return nil, fmt.Errorf("rdma: DialN: n = %d, want >= 1", n)
	}
	conns := make([]Conn, 0, n)
	for range n {
		c, err := Dial(ctx, network, addr, opts)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// Listen serves d's memory with the named provider at addr.
func Listen(network, addr string, d *Domain, opts ListenOptions) (Listener, error) {
	p, err := lookup(network)
	if err != nil {
		return nil, err
	}
	return p.Listen(addr, d, opts)
}
