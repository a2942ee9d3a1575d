package swapfs

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
)

// Stats are the counters of a FS. The stats file of the mount reads as
// their JSON.
type Stats struct {
	Size          uint64 `json:"size"`           // bytes in the swap file
	SlabSize      uint64 `json:"slab_size"`      // bytes per slab
	Slabs         uint64 `json:"slabs"`          // slabs allocated in the pool
	BlocksWritten uint64 `json:"blocks_written"` // distinct blocks ever written
	Reads         uint64 `json:"reads"`          // READ requests
	Writes        uint64 `json:"writes"`         // WRITE requests
	ReadBytes     uint64 `json:"read_bytes"`     // bytes returned by READs
	WriteBytes    uint64 `json:"write_bytes"`    // bytes accepted by WRITEs
	PoolReadOps   uint64 `json:"pool_read_ops"`  // rdma READ ops to pool slabs
	PoolWriteOps  uint64 `json:"pool_write_ops"` // rdma WRITE ops to pool slabs
	PoolReadBytes uint64 `json:"pool_read_bytes"`
	// PoolWriteBytes counts bytes written to a slab once, whatever its
	// number of replicas.
	PoolWriteBytes uint64 `json:"pool_write_bytes"`
	ZeroBlocks     uint64 `json:"zero_blocks"` // never-written blocks read as zeros, no traffic
	Retries        uint64 `json:"retries"`     // batches retried because no replica was reachable
	Errors         uint64 `json:"errors"`      // requests failed with EIO
	// ChecksumErrors counts copies of blocks read from the pool that
	// failed their checksum (pager/slabio): each was read again from
	// another replica and rewritten there, or the READ failed with EIO
	// (the kernel's swap-in then raises SIGBUS: never wrong bytes).
	ChecksumErrors uint64 `json:"checksum_errors"`
}

// ParseStats decodes the content of a stats file.
func ParseStats(b []byte) (Stats, error) {
	var s Stats
	if err := json.Unmarshal(b, &s); err != nil {
		return Stats{}, fmt.Errorf("swapfs: stats: %w", err)
	}
	return s, nil
}

type counters struct {
	reads, writes, readBytes, writeBytes         atomic.Uint64
	poolReadOps, poolWriteOps                    atomic.Uint64
	poolReadBytes, poolWriteBytes, zero, retries atomic.Uint64
	errors, slabs, checksumErrors                atomic.Uint64
}
