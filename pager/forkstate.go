package pager

import (
	"time"

	"go.uber.org/zap"

	"rmem/userfaultfd"
)

// forkState follows the process's forks: how many raised FORK events, a
// fork without FORK events under way (FORK_PREPARE until FORK_DONE: no
// evictions meanwhile), and a fork waiting for the eviction in flight
// (fork.go, park): its FORK event and the messages after it, or its
// FORK_PREPARE's answer. Its decisions take the time as an argument.
type forkState struct {
	forks    uint64
	forking  uint64    // serial of a FORK_PREPARE until its FORK_DONE: no evictions meanwhile
	forkedAt time.Time // when that FORK_PREPARE was answered (see stalled)
	// A fork waiting for the eviction in flight (park): since when, the
	// messages set aside, and a FORK_PREPARE's request not answered yet.
	parkedSince time.Time
	parked      []userfaultfd.Msg // a FORK event and what came after it
	parkedSpare []userfaultfd.Msg
	preparing   bool
	prepareSeq  uint32
}

// maxForkPause bounds how long a FORK_PREPARE pauses evictions without its
// FORK_DONE (the shim sends it as soon as fork(2) returns).
const maxForkPause = 10 * time.Second

// maxSettle bounds how long a fork waits for the eviction in flight.
const maxSettle = 10 * time.Second

// stalled reports whether evictions are paused for a fork at now; a pause
// whose FORK_DONE never came ends after maxForkPause, so that a shim that
// failed to send it does not leave the process over budget for good.
func (f *forkState) stalled(now time.Time, log *zap.Logger) bool {
	if f.forking == 0 {
		return false
	}
	if f.preparing {
		return true // forkSettled ends it
	}
	if now.Sub(f.forkedAt) > maxForkPause {
		log.Warn("no FORK_DONE after FORK_PREPARE; evictions resume", zap.Uint64("serial", f.forking))
		f.forking = 0
		return false
	}
	return true
}

// mustPark reports whether a fork must wait at now for the eviction in
// flight (busy: one is, and the client is there to finish it): until it
// has waited maxSettle.
func (f *forkState) mustPark(busy bool, now time.Time) bool {
	return busy && (f.parkedSince.IsZero() || now.Sub(f.parkedSince) < maxSettle)
}

// park sets aside msgs, from a FORK event on, and early, read ahead after
// them, from now.
func (f *forkState) park(msgs, early []userfaultfd.Msg, now time.Time) {
	f.parked = append(append(f.parked[:0], msgs...), early...)
	if f.parkedSince.IsZero() {
		f.parkedSince = now
	}
}

// unpark returns the messages set aside, to be handled now.
func (f *forkState) unpark() []userfaultfd.Msg {
	msgs := f.parked
	f.parked, f.parkedSpare = f.parkedSpare[:0], msgs
	return msgs
}

// prepare starts the pause of fork serial at now (FORK_PREPARE).
func (f *forkState) prepare(serial uint64, now time.Time) { f.forking, f.forkedAt = serial, now }

// waitPrepare parks the answer to FORK_PREPARE request seq from now.
func (f *forkState) waitPrepare(seq uint32, now time.Time) {
	f.preparing, f.prepareSeq, f.parkedSince = true, seq, now
}
