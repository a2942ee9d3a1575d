package pager

import (
	"time"

	"go.uber.org/zap"
)

// roomState is what the client knows of the pool's room: since when
// evictions found no slots and until when they pause, drains and trims it
// took part in, and what it has said about an unreachable pool (once
// each). Its decisions take the time as an argument.
type roomState struct {
	noRoomSince time.Time // eviction found no pool slots for dirty pages
	noRoomRetry time.Time // and tries again from then on (or when room returns)
	reloc       relocation
	trimSeen    uint64    // the pool's last trim this client did
	stuckSaid   time.Time // a fault waited stuckWarn for an unreachable pool (said once)
	gaveUp      bool      // faults were given up (FaultTimeout): said once
	bentSaid    bool      // the budget bent for an unreachable pool: said once
}

// noRoomPause is how long eviction waits after the pool had no room for
// it, unless the pool says it has room again sooner.
const noRoomPause = 200 * time.Millisecond

// stuckWarn is how long a fault waits for an unreachable pool before the
// agent says so.
const stuckWarn = 5 * time.Second

// paused reports whether evictions wait at now after the pool had no room
// for them (pause).
func (rs *roomState) paused(now time.Time) bool { return now.Before(rs.noRoomRetry) }

// pausing reports whether evictions wait for room (resume ends that).
func (rs *roomState) pausing() bool { return !rs.noRoomRetry.IsZero() }

// resume ends a pause: the pool has room again (onRoom woke the loop).
func (rs *roomState) resume() { rs.noRoomRetry = time.Time{} }

// short records that an eviction found no pool slots at now for some of
// its dirty victims (st.noRoomSince shows since when); pause: for none of
// them, and none was evicted: evictions pause for noRoomPause or until
// the pool has room again.
func (rs *roomState) short(now time.Time, pause bool, st *counters, log *zap.Logger) {
	if rs.noRoomSince.IsZero() {
		rs.noRoomSince = now
		st.noRoomSince.Store(now.UnixNano())
		log.Debug("no pool slots for dirty pages: only clean pages are evicted, and faults past the budget wait")
	}
	if pause {
		rs.noRoomRetry = now.Add(noRoomPause)
	}
}

// again records that the pool gave slots at now after it had none.
func (rs *roomState) again(now time.Time, st *counters, log *zap.Logger) {
	rs.noRoomRetry = time.Time{}
	if !rs.noRoomSince.IsZero() {
		log.Debug("pool slots for eviction again", zap.Duration("waited", now.Sub(rs.noRoomSince)))
		rs.noRoomSince = time.Time{}
		st.noRoomSince.Store(0)
	}
}

// giveUp reports whether a fault of process pid waiting since since for
// a page no replica of which answers (err) has waited limit at now
// (FaultTimeout; 0 or less: forever): then it is given up. It says so
// once per client when a fault first waits stuckWarn, and when it gives
// up.
func (rs *roomState) giveUp(since, now time.Time, limit time.Duration, err error, pid int, log *zap.Logger) bool {
	waited := now.Sub(since)
	if waited >= stuckWarn && rs.stuckSaid.IsZero() {
		rs.stuckSaid = now
		log.Warn("a fault waits for the pool: no replica of its page answers; the program gets SIGBUS if none does in time",
			zap.Int("pid", pid), zap.Duration("waited", waited.Round(time.Millisecond)),
			zap.Duration("fault_timeout", limit), zap.Error(err))
	}
	if limit <= 0 || waited < limit {
		return false
	}
	if !rs.gaveUp {
		rs.gaveUp = true
		log.Error("PAGES LOST TO THE PROGRAM: no replica answered within the fault timeout; its faults on them get SIGBUS",
			zap.Int("pid", pid), zap.Duration("fault_timeout", limit), zap.Error(err))
	}
	return true
}

// bent says, once, that the budget of process pid bent for a pool that
// did not answer within limit (FaultTimeout).
func (rs *roomState) bent(limit time.Duration, pid int, log *zap.Logger) {
	if !rs.bentSaid {
		rs.bentSaid = true
		log.Warn("the pool does not answer: the program goes over its budget rather than wait any longer",
			zap.Int("pid", pid), zap.Duration("fault_timeout", limit))
	}
}
