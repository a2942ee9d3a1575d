package proto

// The fault ring: how a process whose uffd raises SIGBUS (HelloRing) hands
// its page faults to the agent through shared memory, and waits there, in
// the faulting thread, instead of sleeping in the kernel until another
// thread installs the page (docs/pager.md, Misses in the faulting thread).
//
// It is one page of the staging memfd, after the staging slots, mapped by
// the process and the agent: a header, then RingEntries entries of one
// cache line each. All fields are little endian; the state words are
// accessed with atomic operations on both sides, and are futex words
// (FUTEX_WAIT/FUTEX_WAKE without FUTEX_PRIVATE_FLAG: the mapping is
// shared between processes).
//
// A fault, by the faulting thread (its SIGBUS handler):
//
//  1. claims a FREE entry (compare-and-swap to RingClaimed), writes Addr,
//     TID, Flags and Posted, and stores RingPosted;
//  2. if the header's Agent word is RingAsleep, rings the doorbell (writes
//     1 to the eventfd WELCOME gave);
//  3. waits for the entry to leave RingPosted and RingServing: polls a
//     while, then sets Waiters and sleeps in FUTEX_WAIT on State;
//  4. reads the result and stores RingFree: RingDone, the page is mapped
//     (or the fault is to be taken again: the access is retried);
//     RingLost, the page is poisoned (the retried access raises the
//     SIGBUS of a lost page); RingNotMine, the address is in none of the
//     process's regions: the SIGBUS is not a fault of the pager's and
//     goes to the program's own handler, or kills as it would have.
//
// The agent, in the client's loop: takes a RingPosted entry (stores
// RingServing), serves the fault as one read from the uffd (the same
// budget, prefetch, holds and installs through the uffd), and when the
// page is mapped, or the fault given up, stores the result and, if
// Waiters is set, wakes the waiters (FUTEX_WAKE). Before the loop blocks in
// poll(2) it stores RingAsleep in the header and looks at the entries once
// more (a post that saw RingAwake was made before: it is found); when it
// wakes it stores RingAwake.
//
// A resuming agent (HelloResume with a ring) takes RingServing entries
// back as RingPosted: their faults were being served by the agent that
// died, and their threads still wait.

// Ring layout.
const (
	// RingSize is the ring's size in the staging memfd: one page.
	RingSize = 4096
	// RingEntries is the number of entries after the header.
	RingEntries = RingSize/RingEntrySize - 1
	// RingEntrySize is the size of the header and of each entry: a
	// cache line, so that threads posting in different entries do not
	// share one.
	RingEntrySize = 64
	// RingMagic is the header's first word ("RING"), written by the agent.
	RingMagic uint32 = 'R' | 'I'<<8 | 'N'<<16 | 'G'<<24
)

// Header fields: byte offsets in the ring.
const (
	RingHdrMagic     = 0  // u32: RingMagic
	RingHdrEntries   = 4  // u32: RingEntries
	RingHdrAgent     = 8  // u32: RingAwake or RingAsleep (the agent's)
	RingHdrPosted    = 16 // u64: faults posted (the threads add 1 each)
	RingHdrDoorbells = 24 // u64: doorbells rung (the threads add 1 each)
)

// The Agent word of the header.
const (
	RingAwake  uint32 = 0 // the agent looks at the ring before it blocks
	RingAsleep uint32 = 1 // the agent sleeps in poll(2): ring the doorbell
)

// Entry fields: byte offsets in an entry (entry i is at
// RingEntrySize*(i+1)).
const (
	RingEntState   = 0  // u32: the entry's state (a futex word)
	RingEntWaiters = 4  // u32: nonzero while a thread sleeps on State
	RingEntTID     = 8  // u32: the faulting thread
	RingEntFlags   = 12 // u32: RingWrite
	RingEntAddr    = 16 // u64: the faulting address
	RingEntPosted  = 24 // u64: CLOCK_MONOTONIC ns when it was posted (the thread's)
)

// RingWrite: the access that faulted was a write (the page fault's error
// code in the signal's context).
const RingWrite uint32 = 1 << 0

// Entry states.
const (
	RingFree    uint32 = 0 // unused
	RingClaimed uint32 = 1 // a thread is filling it in
	RingPosted  uint32 = 2 // a fault for the agent
	RingServing uint32 = 3 // the agent took it
	RingDone    uint32 = 4 // served: retry the access
	RingLost    uint32 = 5 // the page is lost: it is poisoned
	RingNotMine uint32 = 6 // not a fault in one of the process's regions
)

// RingEntryOffset is where entry i starts in the ring.
func RingEntryOffset(i int) int { return RingEntrySize * (i + 1) }
