// Package store keeps the coordinator's metadata (servers, leases, slabs)
// behind a small transactional key-value interface, Store, with three
// implementations: Bolt, an embedded bbolt file (the default; a coordinator
// restarted on the same file loses nothing); Etcd, in an etcd cluster
// (several coordinators share it, one elected leader writes); and Mem, in
// memory (tests, and benchmarks that measure the coordinator rather than
// the disk).
//
// Etcd maps a bucket to the key prefix PREFIX/bucket/, a View to reads at
// one revision, and an Update to one etcd transaction: fn runs against
// reads pinned at one revision with its writes buffered, and the commit
// compares the modification revisions of everything fn read (whole buckets
// for ForEach), so a concurrent writer makes fn run again. A Fenced view
// adds one more comparison, that the coordinator's election key still
// exists at the revision its term began with: a deposed leader's writes
// fail with ErrFenced and change nothing. Every fenced commit also writes
// PREFIX/term, "REV OWNER" of the term that wrote it.
//
// It is not for interpreting values: the coordinator encodes its records
// (JSON) and the store keeps bytes. It is not for electing the leader
// (pool/coord/elect).
//
// Concurrency: a Store is safe for concurrent use. Updates are serialised
// (per process for Etcd; across processes only the fenced leader writes);
// Views may run concurrently with each other and with an Update, and see the
// state before or after it, never part of it.
package store
