package swaprun

import (
	"context"
	"time"

	"go.uber.org/zap"

	"rmem/internal/cgroup"
)

// RoutineWatchOOM turns the group's OOM killer back on when its processes
// have waited under OOM for grace without interruption: the swap is then
// not keeping up (full, or the pool unreachable) and waiting longer would
// hang CMD instead of failing it. It does so at once when swapDead is
// closed (the swap daemon died: nothing will be written out any more).
// It polls until ctx ends.
func RoutineWatchOOM(ctx context.Context, g *cgroup.Group, grace time.Duration, swapDead <-chan struct{}, log *zap.Logger) {
	const every = 100 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	var since time.Time // start of the current wait under OOM
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
			switch {
			case err != nil:
				log.Warn("reading the cgroup's OOM state", zap.Error(err))
				return
			case !under:
				since = time.Time{}
			case since.IsZero():
				since = now
			case now.Sub(since) >= grace:
				log.Warn("the command waited at its memory limit too long; letting the OOM killer act",
					zap.Duration("waited", now.Sub(since)), zap.String("cgroup", g.Path))
				if err := g.SetOOMKill(true); err != nil {
					log.Error("turning the OOM killer back on", zap.Error(err))
				}
				return
			}
		}
	}
}
