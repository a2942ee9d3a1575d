package memserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"rmem/pool"
	"rmem/pool/httpapi"
)

// Registrar is the coordinator as a memory server sees it (pool/client's
// Client, or an adapter over an in-process coord.Coordinator).
type Registrar interface {
	Register(ctx context.Context, info pool.ServerInfo) (pool.Server, error)
	Heartbeat(ctx context.Context, id pool.ServerID, hb pool.Heartbeat) error
	Leave(ctx context.Context, id pool.ServerID) error
}

// RoutineJoin registers the server with the coordinator (retrying until it
// succeeds), then heartbeats every interval, registering again when the
// coordinator does not know this instance. When ctx is done it tells the
// coordinator it leaves (its memory goes with it) and returns; also when
// the stop cut a registration short, whose answer it never read: the
// coordinator may have it, and would otherwise count the server up until
// its heartbeats are missed, then dead (a failure, not a departure).
// ready, if not nil, is closed after the first successful registration;
// until then failed, if not nil, is told of each failed attempt, and the
// log says once that the server waits for the coordinator (a server
// started beside it comes up first as often as not).
func (s *Server) RoutineJoin(ctx context.Context, reg Registrar, interval time.Duration, ready chan<- struct{}, failed func(error)) {
	log := s.opts.Log
	registered, joined, said := false, false, false
	cut := false // the stop cut a registration short: the coordinator may have it
	backoff := interval
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if registered || cut {
				lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if err := reg.Leave(lctx, s.opts.ID); err != nil && !(cut && errors.Is(err, pool.ErrNotFound)) {
					log.Warn("leaving the pool", zap.Error(err))
				}
				cancel()
			}
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if !registered {
			if _, err := reg.Register(cctx, s.Registration()); err != nil {
				cut = ctx.Err() != nil
				if !joined && failed != nil {
					failed(err)
				}
				switch {
				case joined: // the coordinator lost us: say every attempt
					log.Warn("registering with the coordinator", zap.Error(err), zap.Duration("retry_in", backoff))
				case !said:
					log.Info("waiting for the coordinator", zap.Error(err))
					said = true
				default:
					log.Debug("waiting for the coordinator", zap.Error(err), zap.Duration("retry_in", backoff))
				}
				t.Reset(backoff)
				backoff = min(2*backoff, 10*time.Second)
				cancel()
				continue
			}
			registered, joined, backoff = true, true, interval
			log.Info("registered with the coordinator")
			if ready != nil {
				close(ready)
				ready = nil
			}
		} else if err := reg.Heartbeat(cctx, s.opts.ID, s.Heartbeat()); err != nil {
			log.Warn("heartbeat", zap.Error(err))
			if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrStaleInstance) {
				registered = false
				t.Reset(0)
				cancel()
				continue
			}
		}
		cancel()
		t.Reset(interval)
	}
}

// Routes registers the control endpoint on mux: POST /v1/memserver/grant
// and POST /v1/memserver/free, and GET /v1/memserver. Authenticating the
// pool's clients is the caller's; grant and free also want the server's
// control secret (pool.ControlSecretHeader), which only the coordinator
// holds: an agent has the pool's token too, and must not be able to
// revoke and zero another agent's slab.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/memserver/grant", func(w http.ResponseWriter, r *http.Request) {
		if !s.fromCoordinator(w, r) {
			return
		}
		var req pool.GrantRequest
		if err := httpapi.Decode(r, &req); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		keys, err := s.Grant(r.Context(), req.Instance, req.Epoch, req.Indexes)
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, pool.GrantResponse{Keys: keys})
	})
	mux.HandleFunc("POST /v1/memserver/free", func(w http.ResponseWriter, r *http.Request) {
		if !s.fromCoordinator(w, r) {
			return
		}
		var req pool.FreeRequest
		if err := httpapi.Decode(r, &req); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		if err := s.Free(r.Context(), req.Instance, req.Slabs); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("GET /v1/memserver", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, s.Info())
	})
}

// fromCoordinator checks r's control secret, answering 403 when it is not
// this server's.
func (s *Server) fromCoordinator(w http.ResponseWriter, r *http.Request) bool {
	got := r.Header.Get(pool.ControlSecretHeader)
	if subtle.ConstantTimeCompare([]byte(got), []byte(s.secret)) == 1 {
		return true
	}
	msg := "grant and free are the coordinator's: wrong " + pool.ControlSecretHeader
	if got == "" {
		msg = "grant and free are the coordinator's: no " + pool.ControlSecretHeader
	}
	httpapi.WriteError(w, fmt.Errorf("%w: %s", pool.ErrForbidden, msg))
	return false
}
