package rdma

import (
	"context"
	"fmt"
)

// The synchronous helpers post one request and wait for its completion.
// Use them only on a Conn with nothing else outstanding (they take the first
// completion). The hot path of a pager should post batches from preallocated
// WorkRequest and Completion arrays instead; these helpers may allocate.

// Read reads len(buf) bytes at off of key's range into buf.
func Read(ctx context.Context, c Conn, key Key, off uint64, buf []byte) error {
	_, err := do(ctx, c, WorkRequest{Op: OpRead, Key: key, Offset: off, Local: buf})
	return err
}

// Write writes buf at off of key's range.
func Write(ctx context.Context, c Conn, key Key, off uint64, buf []byte) error {
	_, err := do(ctx, c, WorkRequest{Op: OpWrite, Key: key, Offset: off, Local: buf})
	return err
}

// CompareAndSwap sets the word at off to swap if it equals cmp, and returns
// the word's old value (the swap happened iff old == cmp).
func CompareAndSwap(ctx context.Context, c Conn, key Key, off, cmp, swap uint64) (old uint64, err error) {
	return do(ctx, c, WorkRequest{Op: OpCompareSwap, Key: key, Offset: off, Compare: cmp, Swap: swap})
}

// FetchAdd adds add to the word at off and returns its old value.
func FetchAdd(ctx context.Context, c Conn, key Key, off, add uint64) (old uint64, err error) {
	return do(ctx, c, WorkRequest{Op: OpFetchAdd, Key: key, Offset: off, Add: add})
}

func do(ctx context.Context, c Conn, wr WorkRequest) (uint64, error) {
	wrs := [1]WorkRequest{wr}
	if err := c.Post(wrs[:]); err != nil {
		return 0, err
	}
	var cqes [1]Completion
	for {
		n, err := c.Wait(ctx, cqes[:])
		if err != nil {
			// The request stays outstanding on ctx expiry; the caller owns
			// buf until the Conn completes or is closed.
			return 0, err
		}
		if n == 1 {
			break
		}
	}
	if err := cqes[0].Err(); err != nil {
		return 0, fmt.Errorf("%s at offset %d: %w", wr.Op, wr.Offset, err)
	}
	return cqes[0].Value, nil
}
