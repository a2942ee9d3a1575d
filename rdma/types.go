package rdma

import (
	"errors"
	"fmt"
)

// MaxTransfer is the largest READ or WRITE a single work request may carry.
// Bigger transfers are split by the caller; the bound keeps every provider's
// buffers and frames bounded.
const MaxTransfer = 1 << 20

// AtomicSize is the size of the word COMPARE_AND_SWAP and FETCH_ADD act on.
// The word must be 8-byte aligned in the region's memory and is read and
// written in host byte order (little-endian on every supported machine).
const AtomicSize = 8

// Access is the set of rights a key grants.
//
// AccessWrite does not imply AccessRead: a write-only key can WRITE but not
// READ. Atomics read and write, so they need AccessReadWrite.
type Access uint8

const (
	AccessRead      Access = 1 << iota // READ
	AccessWrite                        // WRITE
	AccessReadWrite = AccessRead | AccessWrite
)

// Valid reports whether a is a non-empty combination of known rights.
func (a Access) Valid() bool { return a != 0 && a&^AccessReadWrite == 0 }

func (a Access) String() string {
	switch a {
	case AccessRead:
		return "r"
	case AccessWrite:
		return "w"
	case AccessReadWrite:
		return "rw"
	}
	return fmt.Sprintf("Access(%d)", uint8(a))
}

// Allows reports whether a grants what op needs.
func (a Access) Allows(op Opcode) bool {
	switch op {
	case OpRead:
		return a&AccessRead != 0
	case OpWrite:
		return a&AccessWrite != 0
	case OpCompareSwap, OpFetchAdd:
		return a&AccessReadWrite == AccessReadWrite
	}
	return false
}

// Opcode is the operation of a work request.
type Opcode uint8

const (
	OpRead        Opcode = 1 + iota // remote → Local
	OpWrite                         // Local → remote
	OpCompareSwap                   // if *remote == Compare { *remote = Swap }; old value returned
	OpFetchAdd                      // *remote += Add; old value returned
)

// Valid reports whether op is a known opcode.
func (op Opcode) Valid() bool { return op >= OpRead && op <= OpFetchAdd }

// IsAtomic reports whether op is COMPARE_AND_SWAP or FETCH_ADD.
func (op Opcode) IsAtomic() bool { return op == OpCompareSwap || op == OpFetchAdd }

func (op Opcode) String() string {
	switch op {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	case OpCompareSwap:
		return "COMPARE_AND_SWAP"
	case OpFetchAdd:
		return "FETCH_ADD"
	}
	return fmt.Sprintf("Opcode(%d)", uint8(op))
}

// Status is the outcome of one work request, carried by its Completion.
type Status uint8

const (
	StatusOK          Status = iota
	StatusUnknownKey         // no such key (never issued, or revoked long ago)
	StatusRevokedKey         // the key was revoked
	StatusOutOfBounds        // [offset, offset+len) is not inside the key's range
	StatusPermission         // the key does not grant the op
	StatusMisaligned         // an atomic on a word that is not 8-byte aligned
	StatusInvalid            // malformed request (bad opcode, length)
	StatusTransport          // the connection failed before the op completed; it may or may not have executed
	numStatus
)

// Valid reports whether s is a known status.
func (s Status) Valid() bool { return s < numStatus }

var statusErrs = [numStatus]error{
	StatusOK:          nil,
	StatusUnknownKey:  ErrUnknownKey,
	StatusRevokedKey:  ErrRevokedKey,
	StatusOutOfBounds: ErrOutOfBounds,
	StatusPermission:  ErrPermission,
	StatusMisaligned:  ErrMisaligned,
	StatusInvalid:     ErrInvalidRequest,
	StatusTransport:   ErrTransport,
}

// Err maps s to its sentinel error (nil for StatusOK). It does not allocate.
func (s Status) Err() error {
	if s < numStatus {
		return statusErrs[s]
	}
	return ErrInvalidRequest
}

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusUnknownKey:
		return "UnknownKey"
	case StatusRevokedKey:
		return "RevokedKey"
	case StatusOutOfBounds:
		return "OutOfBounds"
	case StatusPermission:
		return "Permission"
	case StatusMisaligned:
		return "Misaligned"
	case StatusInvalid:
		return "Invalid"
	case StatusTransport:
		return "Transport"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Errors. Per-request errors arrive as a Completion's Status; Status.Err maps
// them to these sentinels. Test with errors.Is.
var (
	ErrUnknownKey     = errors.New("rdma: unknown key")
	ErrRevokedKey     = errors.New("rdma: key revoked")
	ErrOutOfBounds    = errors.New("rdma: out of bounds")
	ErrPermission     = errors.New("rdma: permission denied")
	ErrMisaligned     = errors.New("rdma: misaligned atomic")
	ErrInvalidRequest = errors.New("rdma: invalid work request")
	ErrTransport      = errors.New("rdma: transport failure")

	ErrQueueFull        = errors.New("rdma: queue full")
	ErrClosed           = errors.New("rdma: connection closed")
	ErrIdle             = errors.New("rdma: nothing outstanding")
	ErrVersion          = errors.New("rdma: protocol version mismatch")
	ErrProtocol         = errors.New("rdma: protocol error")
	ErrUnknownProvider  = errors.New("rdma: unknown provider")
	ErrBadKey           = errors.New("rdma: malformed key")
	ErrRegistered       = errors.New("rdma: region is registered")
	ErrNotRegistered    = errors.New("rdma: region not registered")
	ErrRevokeIncomplete = errors.New("rdma: revoke incomplete")
	ErrNotShareable     = errors.New("rdma: region has no file descriptor")
)

// WorkRequest is one operation posted on a Conn (a verbs send WR).
//
// The Local buffer belongs to the provider from Post until the request's
// completion is returned by Poll or Wait: a READ writes into it directly and a
// WRITE may read from it at any time in between, as with verbs. When a READ
// completes with an error, its Local contents are undefined (as with verbs:
// the tcp provider reads speculatively into it).
type WorkRequest struct {
	ID     uint64 // caller's id, returned in the Completion
	Op     Opcode
	Key    Key
	Offset uint64 // relative to the start of the key's range
	// Local is the READ destination or the WRITE source; its length is the
	// transfer length (0..MaxTransfer). Atomics ignore it unless it has at
	// least 8 bytes, in which case the old value is also stored there in
	// host byte order.
	Local   []byte
	Compare uint64 // OpCompareSwap: expected value
	Swap    uint64 // OpCompareSwap: new value
	Add     uint64 // OpFetchAdd: addend
}

// Len returns the number of bytes the request moves on the remote side.
func (wr *WorkRequest) Len() int {
	if wr.Op.IsAtomic() {
		return AtomicSize
	}
	return len(wr.Local)
}

// Check validates wr locally (what a provider rejects in Post).
func (wr *WorkRequest) Check() error {
	if !wr.Op.Valid() {
		return fmt.Errorf("%w: opcode %d", ErrInvalidRequest, wr.Op)
	}
	if len(wr.Local) > MaxTransfer && !wr.Op.IsAtomic() {
		return fmt.Errorf("%w: length %d > MaxTransfer %d", ErrInvalidRequest, len(wr.Local), MaxTransfer)
	}
	return nil
}

// Completion reports the outcome of one WorkRequest (a verbs CQE).
type Completion struct {
	ID     uint64
	Op     Opcode
	Status Status
	Len    uint32 // bytes moved (READ/WRITE), 8 for atomics, 0 on error
	Value  uint64 // atomics: the value the word had before the op
}

// Err returns c.Status.Err().
func (c *Completion) Err() error { return c.Status.Err() }
