// Package pager is rmem's paging engine: the regions that clients hand to
// memagent, their page tables, fault handling, eviction under a local-memory
// budget, dirty tracking, prefetch and replication to the pool.
//
// It is not the kernel interface (package userfaultfd), not the transport
// (package rdma) and not the pool's bookkeeping (package pool); it consumes
// small interfaces over each.
//
// Policies are plain state driven by the fault and eviction loops:
//   - Prefetcher: Leap-style majority-trend detection of sequential and
//     strided fault streams, with a prefetch depth that adapts to hits.
package pager
