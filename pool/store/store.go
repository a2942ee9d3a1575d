package store

import "errors"

// Bucket is a namespace of keys (an etcd key prefix).
type Bucket string

// The buckets the coordinator uses. Open creates them.
const (
	Servers Bucket = "servers"
	Leases  Bucket = "leases"
	Slabs   Bucket = "slabs"
	Meta    Bucket = "meta"
)

// Buckets lists every bucket, in a fixed order.
var Buckets = []Bucket{Servers, Leases, Slabs, Meta}

// Errors.
var (
	ErrNotFound      = errors.New("store: not found")
	ErrUnknownBucket = errors.New("store: unknown bucket")
	ErrReadOnly      = errors.New("store: write in a read-only transaction")
	ErrClosed        = errors.New("store: closed")
	ErrEmptyKey      = errors.New("store: empty key")
)

// Store is the coordinator's metadata storage.
//
// Contract:
//   - Update runs fn in a read-write transaction. If fn returns nil, all its
//     writes become visible at once and are durable (on disk for Bolt) when
//     Update returns nil. If fn returns an error, or Update fails, none of
//     them is applied, and Update returns that error (wrapped or as is).
//   - View runs fn in a read-only transaction over a consistent snapshot;
//     writes in it fail with ErrReadOnly.
//   - fn must not retain a Tx, or a value slice returned by Get or passed
//     to ForEach, after it returns (copy what you keep). Put copies val.
//   - fn must not call View or Update (it would deadlock on Bolt).
//   - fn may run more than once for one Update (an etcd implementation
//     retries on a conflicting revision), so it must have no effects outside
//     the Tx; the coordinator applies its in-memory change only after
//     Update returned nil.
//   - After Close, View and Update return ErrClosed. Close is idempotent.
type Store interface {
	View(fn func(Tx) error) error
	Update(fn func(Tx) error) error
	Close() error
}

// Tx is a transaction. Keys are non-empty strings; buckets are one of Buckets.
type Tx interface {
	// Get returns the value of key, or ErrNotFound.
	Get(b Bucket, key string) ([]byte, error)
	// Put sets key to val.
	Put(b Bucket, key string, val []byte) error
	// Delete removes key; deleting a missing key is not an error.
	Delete(b Bucket, key string) error
	// ForEach calls fn for every key of b in ascending byte order, seeing
	// the transaction's own writes. It stops at fn's first error and
	// returns it. fn must not modify b.
	ForEach(b Bucket, fn func(key string, val []byte) error) error
}

func validBucket(b Bucket) bool {
	for _, x := range Buckets {
		if x == b {
			return true
		}
	}
	return false
}
