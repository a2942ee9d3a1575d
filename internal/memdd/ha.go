package memdd

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/coord"
	"rmem/pool/coord/elect"
	"rmem/pool/httpapi"
	"rmem/pool/store"
)

// leader runs the coordinator role over etcd: it campaigns, and for each
// term it wins builds a coordinator on the store fenced by that term
// (reloading the state), serves it, and drops it when the term ends.
type leader struct {
	log     *zap.Logger
	st      *store.Etcd
	el      *elect.Elector
	self    elect.Info
	newOpts func(st store.Store, term coord.Term, reg *prometheus.Registry) coord.Options
	sweep   time.Duration
	cur     atomic.Pointer[termState]
	leading prometheus.Gauge
}

// termState is what one term serves.
type termState struct {
	term *elect.Term
	co   *coord.Coordinator
	mux  *http.ServeMux
	reg  *prometheus.Registry
}

// ServeHTTP serves the coordinator routes while this coordinator leads,
// and answers 503 naming the leader otherwise.
func (l *leader) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := l.cur.Load()
	if st != nil {
		if err := st.term.Valid(); err == nil {
			st.mux.ServeHTTP(w, r)
			return
		}
	}
	hint := l.el.Hint(r.Context())
	if hint == l.self.URL {
		hint = "" // etcd still names this one, whose term is over
	}
	msg := fmt.Sprintf("%v: %s does not lead the pool now", pool.ErrNotLeader, l.self.ID)
	if hint != "" {
		msg += "; the leader is " + hint
	} else {
		msg += "; no leader is known (an election is under way)"
	}
	httpapi.WriteJSON(w, http.StatusServiceUnavailable, pool.APIError{Error: msg, Leader: hint})
}

// Gather implements prometheus.Gatherer: the current term's coordinator
// metrics, none while not leading.
func (l *leader) Gather() ([]*dto.MetricFamily, error) {
	if st := l.cur.Load(); st != nil {
		return st.reg.Gather()
	}
	return nil, nil
}

// RoutineLead campaigns and leads, term after term, until ctx ends; then
// it resigns (a successor takes over at once).
func (l *leader) RoutineLead(ctx context.Context) {
	for ctx.Err() == nil {
		began := time.Now()
		term, err := l.el.Campaign(ctx)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("campaign for leadership failed; retrying", zap.Error(err))
				sleep(ctx, time.Second)
			}
			continue
		}
		elected := time.Now()
		reg := prometheus.NewRegistry()
		co, err := coord.New(l.newOpts(l.st.Fenced(term.Fence()), term, reg))
		if err == nil {
			mux := http.NewServeMux()
			if err = co.Routes(mux); err == nil {
				mux.HandleFunc("/", httpapi.NotFound)
				l.cur.Store(&termState{term: term, co: co, mux: mux, reg: reg})
			}
		}
		if err != nil {
			l.log.Error("cannot lead: loading the state failed; resigning", zap.Error(err))
			if co != nil {
				co.Close()
			}
			term.Resign(context.Background())
			sleep(ctx, time.Second)
			continue
		}
		l.leading.Set(1)
		st := co.Status()
		l.log.Info("leading the pool", zap.Uint64("epoch", term.Epoch()), zap.Duration("campaign", elected.Sub(began).Round(time.Millisecond)),
			zap.Duration("load", time.Since(elected).Round(time.Millisecond)), zap.Int("servers", st.ServersUp+st.ServersDown),
			zap.Int("leases", st.Agents), zap.Int("slabs", st.Slabs))
		tctx, cancel := context.WithCancel(ctx)
		swept := make(chan struct{})
		go func() { defer close(swept); co.RoutineSweep(tctx, l.sweep) }()
		select {
		case <-term.Done():
		case <-ctx.Done():
		}
		l.cur.Store(nil)
		l.leading.Set(0)
		cancel()
		<-swept
		if ctx.Err() != nil {
			term.Resign(context.Background())
		} else {
			l.log.Warn("stopped leading", zap.Uint64("epoch", term.Epoch()), zap.Error(term.Err()))
		}
		co.Close()
	}
}

// coordinators answers GET /v1/coordinators.
func (l *leader) coordinators(r *http.Request) pool.Coordinators {
	v := pool.Coordinators{Store: "etcd", Endpoints: l.st.Endpoints(), Self: l.self.ID, Coordinators: []pool.CoordinatorView{}}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	ms, err := l.el.Members(ctx)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	for _, m := range ms {
		cv := pool.CoordinatorView{ID: m.ID, URL: m.URL, Leader: m.Leader, Epoch: m.Rev}
		v.Coordinators = append(v.Coordinators, cv)
		if m.Leader {
			v.Leader = &cv
		}
	}
	return v
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
