package coord

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rmem/pool"
	"rmem/pool/httpapi"
)

// Routes registers the coordinator's control API (docs/api.md) on mux,
// under /v1/. Authentication with the pool's token is the caller's (wrap
// mux with httpapi.Auth); the routes about one lease also check its secret
// (CheckLeaseSecret), so that one agent cannot use another's lease or
// learn its keys.
// Each route's latency goes to rmem_pool_api_request_duration_seconds.
func (c *Coordinator) Routes(mux *http.ServeMux) error {
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "rmem", Subsystem: "pool", Name: "api_request_duration_seconds",
		Help:    "Control API latency by route and status code.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	}, []string{"route", "code"})
	if err := c.opts.Registry.Register(lat); err != nil {
		return err
	}
	h := func(pattern string, fn func(w http.ResponseWriter, r *http.Request) (int, any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			var status int
			var body any
			err := c.Leading()
			if err == nil {
				status, body, err = fn(w, r)
			}
			if err == nil && r.Method == http.MethodGet {
				// A read answered after the term ended may be stale.
				err = c.Leading()
			}
			if err != nil {
				status = httpapi.Status(err)
				httpapi.WriteError(w, err)
			} else {
				httpapi.WriteJSON(w, status, body)
			}
			lat.WithLabelValues(pattern, strconv.Itoa(status)).Observe(time.Since(start).Seconds())
		})
	}
	// hl registers a route about one lease: only the holder of its secret
	// may use it (the agent that created it, or took it over).
	hl := func(pattern string, fn func(w http.ResponseWriter, r *http.Request) (int, any, error)) {
		h(pattern, func(w http.ResponseWriter, r *http.Request) (int, any, error) {
			if err := c.CheckLeaseSecret(pool.LeaseID(r.PathValue("id")), r.Header.Get(pool.LeaseSecretHeader)); err != nil {
				return 0, nil, err
			}
			return fn(w, r)
		})
	}
	h("GET /v1/status", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		return 200, c.Status(), nil
	})
	h("GET /v1/servers", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		return 200, c.Servers(), nil
	})
	h("POST /v1/servers", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		var req pool.RegisterRequest
		if err := httpapi.Decode(r, &req); err != nil {
			return 0, nil, err
		}
		rec, err := c.Register(req)
		rec.ControlSecret = ""
		return 200, rec, err
	})
	h("GET /v1/servers/{id}", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		v, err := c.Server(pool.ServerID(r.PathValue("id")))
		return 200, v, err
	})
	h("DELETE /v1/servers/{id}", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		return 200, struct{}{}, c.Leave(pool.ServerID(r.PathValue("id")))
	})
	h("POST /v1/servers/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		var hb pool.Heartbeat
		if err := httpapi.Decode(r, &hb); err != nil {
			return 0, nil, err
		}
		return 200, struct{}{}, c.Heartbeat(pool.ServerID(r.PathValue("id")), hb)
	})
	drain := func(on bool) func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		return func(w http.ResponseWriter, r *http.Request) (int, any, error) {
			id := pool.ServerID(r.PathValue("id"))
			if err := c.SetDrain(id, on); err != nil {
				return 0, nil, err
			}
			v, err := c.Drain(id)
			return 200, v, err
		}
	}
	h("POST /v1/servers/{id}/drain", drain(true))
	h("POST /v1/servers/{id}/undrain", drain(false))
	h("GET /v1/servers/{id}/drain", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		v, err := c.Drain(pool.ServerID(r.PathValue("id")))
		return 200, v, err
	})
	h("GET /v1/leases", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		return 200, c.Leases(), nil
	})
	h("POST /v1/leases", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		var req pool.CreateLeaseRequest
		if err := httpapi.Decode(r, &req); err != nil {
			return 0, nil, err
		}
		l, err := c.CreateLease(req)
		return 201, l, err
	})
	h("GET /v1/leases/{id}", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		v, err := c.Lease(pool.LeaseID(r.PathValue("id")))
		return 200, v, err
	})
	hl("DELETE /v1/leases/{id}", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		return 200, struct{}{}, c.DeleteLease(r.Context(), pool.LeaseID(r.PathValue("id")))
	})
	hl("POST /v1/leases/{id}/renew", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		var req pool.RenewRequest
		if r.ContentLength != 0 { // agents before the report send no body
			if err := httpapi.Decode(r, &req); err != nil {
				return 0, nil, err
			}
		}
		v, err := c.Renew(pool.LeaseID(r.PathValue("id")), req)
		return 200, v, err
	})
	hl("GET /v1/leases/{id}/slabs", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		id := pool.LeaseID(r.PathValue("id"))
		if _, err := c.Lease(id); err != nil {
			return 0, nil, err
		}
		return 200, pool.AllocateResponse{Slabs: c.Slabs(SlabFilter{Lease: id})}, nil
	})
	hl("POST /v1/leases/{id}/slabs", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		var req pool.AllocateRequest
		if err := httpapi.Decode(r, &req); err != nil {
			return 0, nil, err
		}
		v, err := c.Allocate(r.Context(), pool.LeaseID(r.PathValue("id")), req)
		return 201, pool.AllocateResponse{Slabs: v}, err
	})
	hl("DELETE /v1/leases/{id}/slabs/{slab}", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		sid, err := slabID(r)
		if err != nil {
			return 0, nil, err
		}
		return 200, struct{}{}, c.FreeSlab(r.Context(), pool.LeaseID(r.PathValue("id")), sid)
	})
	hl("POST /v1/leases/{id}/slabs/{slab}/replace", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		sid, err := slabID(r)
		if err != nil {
			return 0, nil, err
		}
		var req pool.ReplaceRequest
		if err := httpapi.Decode(r, &req); err != nil {
			return 0, nil, err
		}
		v, err := c.Replace(r.Context(), pool.LeaseID(r.PathValue("id")), sid, req.Server)
		return 201, v, err
	})
	hl("POST /v1/leases/{id}/slabs/{slab}/migrated", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		sid, err := slabID(r)
		if err != nil {
			return 0, nil, err
		}
		var req pool.MigratedRequest
		if err := httpapi.Decode(r, &req); err != nil {
			return 0, nil, err
		}
		return 200, struct{}{}, c.Migrated(r.Context(), pool.LeaseID(r.PathValue("id")), sid, req.Server)
	})
	h("GET /v1/slabs", func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		q := r.URL.Query()
		f := SlabFilter{Server: pool.ServerID(q.Get("server")), Lease: pool.LeaseID(q.Get("lease")), Agent: q.Get("agent")}
		slabs := c.Slabs(f)
		// The admin listing shows where slabs are, not their keys: only the
		// lease-scoped routes hand keys out.
		for i := range slabs {
			for j := range slabs[i].Replicas {
				slabs[i].Replicas[j].Key = ""
			}
		}
		return 200, slabs, nil
	})
	return nil
}

func slabID(r *http.Request) (pool.SlabID, error) {
	n, err := strconv.ParseUint(r.PathValue("slab"), 10, 64)
	if err != nil || n == 0 {
		return 0, notFound("slab", r.PathValue("slab"))
	}
	return pool.SlabID(n), nil
}
