package swaprun

import (
	"context"
	"maps"
	"time"

	"go.uber.org/zap"

	"rmem/internal/cgroup"
)

// With the OOM killer off (v1), a process that cannot be charged sleeps
// under OOM until the kernel wakes it: when a page of the group is
// uncharged, or its limit raised — not when the swap writeback that would
// let reclaim free a page completes. Measured here (qsort of 64 MiB at
// 18 MiB, issue 18): in about one run in five the group sat under OOM
// with every counter of memory.stat still and nothing under writeback,
// for as long as the watchdog let it (30 s with a 30 s grace), and went
// on at once when turning the killer on woke it — or was killed, when
// the retry that followed found nothing to reclaim at that moment: the
// watchdog, which acted on under_oom alone, could not tell this program
// from a stuck one. Now the decision is taken on whether pages move
// (memory.stat), and a group under OOM with nothing moving is first
// nudged (cgroup.Group.Nudge: the kernel reclaims from it, which wakes
// the waiters, without granting it memory); only a group that does not
// move for the grace time despite the nudges is stuck.

// progressKeys are the memory.stat counters that move when the group's
// processes get memory: pages charged and uncharged (v1 pgpgin, pgpgout),
// swap-ins (pgmajfault, workingset_refault_anon; v2 pswpin), pages
// written out (v2 pswpout), and what is in swap or under writeback.
// Counters a stuck process moves by retrying (pgfault) are not among them,
// nor CPU time (a thread spinning beside a stuck one is no progress).
var progressKeys = []string{"pgpgin", "pgpgout", "pgmajfault", "workingset_refault_anon",
	"pswpin", "pswpout", "swap", "writeback"}

// Progress is the group's progress counters (progressKeys) at one moment.
type Progress map[string]uint64

// ProgressOf picks the progress counters out of memory.stat.
func ProgressOf(stat map[string]uint64) Progress {
	p := Progress{}
	for _, k := range progressKeys {
		if v, ok := stat[k]; ok {
			p[k] = v
		}
	}
	return p
}

// OOMSample is what the watchdog reads of the group at one moment.
type OOMSample struct {
	Under    bool // under_oom: a process waits to be charged
	Progress Progress
}

// OOMAction is what the watchdog does after a sample.
type OOMAction int

const (
	OOMWait  OOMAction = iota // nothing: the group is not stuck (yet)
	OOMNudge                  // wake the waiters (cgroup.Group.Nudge)
	OOMKill                   // stuck: turn the OOM killer back on
)

// DefaultNudgeEvery is how long a group may wait under OOM with nothing
// moving before it is nudged, and between nudges.
const DefaultNudgeEvery = 250 * time.Millisecond

// OOMJudge decides, from samples, when to nudge the group and when its
// processes are stuck at their limit: under OOM, with no progress counter
// moving, for Grace despite a nudge every NudgeEvery. A plain value with
// no I/O: RoutineWatchOOM feeds it.
type OOMJudge struct {
	Grace      time.Duration
	NudgeEvery time.Duration // 0: DefaultNudgeEvery

	last   Progress
	since  time.Time // start of the current stretch under OOM without progress
	nudged time.Time // last nudge in that stretch
}

// Step takes the sample s read at now. It returns what to do, and how long
// the group has been under OOM without progress.
func (j *OOMJudge) Step(now time.Time, s OOMSample) (act OOMAction, waited time.Duration) {
	every := j.NudgeEvery
	if every <= 0 {
		every = DefaultNudgeEvery
	}
	moved := j.last == nil || !maps.Equal(j.last, s.Progress)
	j.last = s.Progress
	switch {
	case !s.Under:
		j.since, j.nudged = time.Time{}, time.Time{}
		return OOMWait, 0
	case moved || j.since.IsZero():
		// Pages moved since the last sample (or this is the first
		// stretch): the wait for Grace starts again.
		j.since, j.nudged = now, time.Time{}
	}
	waited = now.Sub(j.since)
	switch {
	case waited >= j.Grace:
		return OOMKill, waited
	case waited >= every && (j.nudged.IsZero() || now.Sub(j.nudged) >= every):
		j.nudged = now
		return OOMNudge, waited
	}
	return OOMWait, waited
}

// RoutineWatchOOM nudges the group when it waits under OOM with nothing
// moving, and turns its OOM killer back on when its processes are stuck at
// their limit (OOMJudge): the swap is then not making room
// (full, or the pool unreachable) and waiting longer would hang CMD
// instead of failing it. A program that is only slow, its pages moving at
// the pace of the swap, is left to wait. It turns the killer on at once
// when swapDead is closed (the swap daemon died: nothing will be written
// out any more). It polls until ctx ends.
func RoutineWatchOOM(ctx context.Context, g *cgroup.Group, grace time.Duration, swapDead <-chan struct{}, log *zap.Logger) {
	const every = 100 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	j := OOMJudge{Grace: grace}
	nudges := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-swapDead:
			log.Warn("the swap daemon died; letting the OOM killer act", zap.String("cgroup", g.Path))
			if err := g.SetOOMKill(true); err != nil {
				log.Error("turning the OOM killer back on", zap.Error(err))
			}
			return
		case now := <-tick.C:
			under, err := g.UnderOOM()
			var stat map[string]uint64
			if err == nil {
				stat, err = g.Stat()
			}
			if err != nil {
				log.Warn("reading the cgroup's OOM state", zap.Error(err))
				return
			}
			switch act, waited := j.Step(now, OOMSample{Under: under, Progress: ProgressOf(stat)}); act {
			case OOMNudge:
				nudges++
				log.Debug("nudging: under OOM with nothing moving", zap.Duration("waited", waited), zap.String("cgroup", g.Path))
				if err := g.Nudge(); err != nil {
					log.Warn("nudging the cgroup's reclaim", zap.Error(err))
				}
			case OOMKill:
				log.Warn("the command waited at its memory limit without progress too long; letting the OOM killer act",
					zap.Duration("waited", waited), zap.Int("nudges", nudges), zap.String("cgroup", g.Path))
				if err := g.SetOOMKill(true); err != nil {
					log.Error("turning the OOM killer back on", zap.Error(err))
				}
				return
			}
		}
	}
}
