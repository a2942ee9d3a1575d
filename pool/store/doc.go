// Package store keeps the coordinator's metadata (servers, leases, slabs)
// behind a small transactional key-value interface, Store, with two
// implementations: Bolt, an embedded bbolt file (the default; a coordinator
// restarted on the same file loses nothing), and Mem, in memory (tests, and
// benchmarks that measure the coordinator rather than the disk).
//
// The interface is shaped so that an etcd implementation (several
// coordinators, one elected) can follow: buckets map to key prefixes, an
// Update to one etcd transaction (STM) and View to a read at one revision.
//
// It is not for interpreting values: the coordinator encodes its records
// (JSON) and the store keeps bytes.
//
// Concurrency: a Store is safe for concurrent use. Updates are serialised;
// Views may run concurrently with each other and with an Update, and see the
// state before or after it, never part of it.
package store
