// Package remote holds the types the pager and the stores under it speak:
// slabs of remote memory (SlabID), page transfers (PageOp), the Store and
// PageIO interfaces with their contracts, and the errors a PageIO sets per
// op. It is the leaf the pager's parts share, as database/sql/driver is for
// database/sql: pager/slabio, pager/poolstore, pager/pagertest and swapfs
// implement or consume these without importing the pager.
//
// It is not an implementation (pager/slabio moves pages, pager/poolstore
// takes slabs from the pool) and holds no state.
package remote

import (
	"context"
	"errors"
	"fmt"
)

// SlabID names one slab of remote memory (all of its replicas) inside a
// Store. It is never 0.
type SlabID uint64

// PageOp is one page-sized (or larger) transfer between a local buffer and a
// slab: READ into Buf, or WRITE from Buf, at byte offset Off of the slab.
// Err is set by the PageIO for this op alone.
type PageOp struct {
	Slab SlabID
	Off  uint64
	Buf  []byte
	Err  error
	// Corrupt counts, after a Read, the copies of the op's pages that
	// failed their checksum (see PageIO): each was read again from
	// another replica and rewritten, or the op ends with ErrCorrupt.
	Corrupt uint32
}

// Errors of a Store and its PageIO, set per op in PageOp.Err.
var (
	// ErrLost: every replica of the slab is gone (dead server, revoked
	// key): its data cannot come back. The pager poisons such pages.
	ErrLost = errors.New("remote: every replica lost")
	// ErrCorrupt: every copy of a page that could be read failed its
	// checksum: its data is gone as surely as a lost slab's (it wraps
	// ErrLost), and the pager poisons the page (SIGBUS, never wrong
	// bytes).
	ErrCorrupt = fmt.Errorf("remote: every copy failed its checksum: %w", ErrLost)
	// ErrUnavailable: no replica could be reached right now (transport
	// failures) but none is known lost: retry later, never guess.
	ErrUnavailable = errors.New("remote: no replica reachable")
	// ErrUnknownSlab: the op names a slab the Store does not hold.
	ErrUnknownSlab = errors.New("remote: unknown slab")
	// ErrClosed: the Store or PageIO was closed.
	ErrClosed = errors.New("remote: closed")
	// ErrFull: Alloc found the pool without room (as opposed to not
	// reaching it): programs past their budgets wait for room.
	ErrFull = errors.New("remote: the pool has no room")
)

// Store is remote memory as the pager consumes it: slabs of SlabSize bytes,
// each replicated on R memory servers, read and written with one-sided rdma
// ops through a PageIO per fault loop.
//
// Contract:
//   - Alloc returns n new slabs whose every replica reads as zeros, or an
//     error and no slab; the error wraps ErrFull when the pool has no
//     room for them (other errors: it could not be asked).
//   - Free gives slabs back; their data is gone afterwards. Freeing an
//     unknown slab is not an error.
//   - The Store keeps redundancy by itself: when the pool reports a replica
//     lost or draining, it copies the slab from a surviving replica to a
//     replacement. The pager learns of a slab with no surviving replica
//     when a READ completes with ErrLost.
//   - Store methods are safe for concurrent use.
type Store interface {
	// SlabSize is the size of every slab in bytes (a multiple of the page
	// size).
	SlabSize() uint64
	Alloc(ctx context.Context, n int) ([]SlabID, error)
	Free(ctx context.Context, ids []SlabID) error
	// OpenIO returns a PageIO with its own connections, for one goroutine.
	OpenIO() (PageIO, error)
}

// PageIO moves pages of a Store's slabs. It is for one goroutine at a time
// and allocates nothing per op once its connections are open.
//
// Contract:
//   - Read fills each op's Buf from the slab's first healthy replica; a
//     replica that fails moves the op to the next one. Each op ends with
//     Err nil, or wrapping ErrLost (no replica holds the data any more),
//     ErrUnavailable (none could be reached; retry later) or
//     ErrUnknownSlab.
//   - Write writes each op's Buf to every replica of its slab. Err nil means
//     every replica that is still trusted holds the data; a replica that
//     failed the WRITE is no longer trusted for READs (it holds stale data)
//     and the Store replaces it.
//   - The returned error is for the whole call (ctx done, closed): then
//     some ops may be unfinished and their Err is set to it.
//   - len(ops) may be any size; the PageIO splits it by its queue depth.
type PageIO interface {
	Read(ctx context.Context, ops []PageOp) error
	Write(ctx context.Context, ops []PageOp) error
	Close() error
}
