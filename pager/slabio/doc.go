// Package slabio carries the pager's remote pages over rdma: a Table of
// slabs and their replicas (network address, key, state), and IO, the
// per-loop PageIO that READs from the first healthy replica with failover
// and WRITEs to every replica. Both Store implementations (pager/poolstore
// over the pool, pager/pagertest in memory) are a Table plus the code that
// fills it, so the replication and failover rules live in one place.
//
// It is NOT the pool's bookkeeping (who owns which slab, leases): the
// caller puts and removes slabs. It decides nothing about pages.
//
// # Rules
//
//   - READ goes to the first Healthy replica; a failed one moves the op to
//     the next. Revoked or unknown keys mean the replica's data is gone
//     (Lost). Transport failures mean unreachable now (ErrUnavailable if no
//     replica answers); the connection is redialled on the next op.
//   - WRITE goes to every replica that is not Lost (Filling included). If
//     some succeed and some fail, the failed ones hold stale data and are
//     marked Lost so no READ ever returns it; if all fail, nothing is
//     marked: they still hold the previous version.
//   - Checksums (sums.go): WRITE records a CRC32C of each whole page in
//     the slab's entry; READ checks each whole page against it. A bad
//     copy moves the op to the next replica, like an error, and the good
//     copy found after it is written back to the replicas (repaired); with
//     no good copy the op ends remote.ErrCorrupt (an ErrLost), and an op
//     of several pages is read again page by page so that its good pages
//     arrive. Table.OnCorrupt hears of each slab and server once.
//   - Migrate copies a slab to a new replica in chunks while the slab is in
//     use: each chunk's READ+WRITE excludes IO.Write calls (copyMu), and
//     writes in between also go to the Filling replica, so the copy never
//     overwrites newer data. The switch (the new replica Healthy, the old
//     one dropped) excludes IO.Write calls too, so no WRITE is in flight
//     to a replica the caller then revokes.
//
// # Registered buffers
//
// IO.RegisterLocal names long-lived buffers the caller's ops use (the
// pager's read buffers and staging slots); connections whose provider can
// move data directly from registered memory (verbs) register them when
// dialled, so pages skip the provider's bounce copy. Other providers ignore
// them. A refused registration only costs that copy.
//
// # Concurrency
//
// Table methods are safe for concurrent use. A slab's replica slice is
// copy-on-write: it is never changed in place, so IO reads it without a
// lock after looking it up. Lock order: copyMu before mu. An IO is for one
// goroutine.
package slabio
