package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"

	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/coord"
	"rmem/pool/httpapi"
	"rmem/pool/pooltest"
	"rmem/pool/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "t0ken"

// serve runs a coordinator behind its real HTTP stack.
func serve(t *testing.T) (*client.Client, *pooltest.Servers, *coord.Coordinator, string) {
	t.Helper()
	ss := &pooltest.Servers{}
	c, err := coord.New(coord.Options{Store: store.NewMem(), Dialer: ss, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	api := http.NewServeMux()
	if err := c.Routes(api); err != nil {
		t.Fatal(err)
	}
	api.HandleFunc("/", httpapi.NotFound)
	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.HandlerFor(c.Registry(), promhttp.HandlerOpts{}))
	root.Handle("/", httpapi.Auth(token, false, api))
	srv := httptest.NewServer(root)
	cl, err := client.New(srv.URL, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.CloseIdleConnections()
		srv.Close()
	})
	for _, id := range []pool.ServerID{"a", "b"} {
		if _, err := cl.Register(context.Background(), ss.Add(id, 4, 1<<20, "")); err != nil {
			t.Fatal(err)
		}
	}
	return cl, ss, c, srv.URL
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	cl, ss, _, _ := serve(t)
	l, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "agent1", Node: "n", PID: 42, TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	slabs, err := cl.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 2, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slabs {
		for _, r := range s.Replicas {
			if ss.Get(r.Server).Keys()[r.Index] != r.Key {
				t.Fatalf("key over HTTP differs from the server's")
			}
		}
	}
	if r, err := cl.Renew(ctx, l.ID, pool.RenewRequest{}); err != nil || len(r.Events) != 0 || !r.Lease.Expires.After(l.Created) {
		t.Fatalf("renew %+v %v", r, err)
	}
	if ls, _ := cl.Leases(ctx); len(ls) != 1 || ls[0].Slabs != 2 || ls[0].Bytes != 2<<20 {
		t.Fatalf("leases %+v", ls)
	}
	if got, _ := cl.Slabs(ctx, client.SlabFilter{Agent: "agent1"}); len(got) != 2 {
		t.Fatalf("slabs by agent: %d", len(got))
	}
	if got, _ := cl.Slabs(ctx, client.SlabFilter{Agent: "nobody"}); len(got) != 0 {
		t.Fatalf("slabs of nobody: %d", len(got))
	}
	if err := cl.FreeSlab(ctx, l.ID, slabs[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := cl.DeleteLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := cl.Status(ctx); st.Used != 0 || st.ServersUp != 2 {
		t.Fatalf("status %+v", st)
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	cl, _, _, url := serve(t)
	l, _ := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "a", TTL: pool.Duration(time.Minute)})

	_, err := cl.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 100, Replicas: 1})
	if !errors.Is(err, pool.ErrNoCapacity) {
		t.Errorf("beyond the pool: %v", err)
	}
	if _, err := cl.Server(ctx, "nope"); !errors.Is(err, pool.ErrNotFound) {
		t.Errorf("unknown server: %v", err)
	}
	if _, err := cl.Drain(ctx, "nope", true); !errors.Is(err, pool.ErrNotFound) {
		t.Errorf("drain unknown server: %v", err)
	}
	if err := cl.FreeSlab(ctx, l.ID, 12345); !errors.Is(err, pool.ErrNotFound) {
		t.Errorf("unknown slab: %v", err)
	}
	var ce *client.Error
	if _, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "a", TTL: 0}); !errors.As(err, &ce) || ce.Status != 400 || ce.Field != "ttl" {
		t.Errorf("bad ttl: %v", err)
	}
	bad, _ := client.New(url, client.Options{Token: "wrong"})
	defer bad.CloseIdleConnections()
	if _, err := bad.Status(ctx); !errors.Is(err, pool.ErrUnauthorized) {
		t.Errorf("bad token: %v", err)
	}

	raw := func(method, path, body string, auth bool) (int, string) {
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if auth {
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set(pool.LeaseSecretHeader, l.Secret)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	defer http.DefaultClient.CloseIdleConnections()
	for _, tt := range []struct {
		method, path, body string
		auth               bool
		status             int
		contains           string
	}{
		{"GET", "/v1/nothing", "", true, 404, `"error"`},
		{"GET", "/v2/status", "", true, 404, `"error"`},
		{"GET", "/v1/status", "", false, 401, `"error"`},
		{"POST", "/v1/leases", `{"agent": "a", "ttl": `, true, 400, "JSON"},
		{"POST", "/v1/leases", `{"agent": 7, "ttl": "1m"}`, true, 400, `"field": "agent"`},
		{"POST", "/v1/leases", `{"agent": "a", "ttl": "1m", "colour": "red"}`, true, 400, `"field": "colour"`},
		{"POST", "/v1/leases/" + string(l.ID) + "/slabs", `{"slabs": -1, "replicas": 1}`, true, 400, `"field": "slabs"`},
		{"POST", "/v1/leases/nope/renew", "", true, 404, "nope"},
		{"DELETE", "/v1/leases/" + string(l.ID) + "/slabs/xyz", "", true, 404, "slab"},
		{"GET", "/metrics", "", false, 200, "rmem_pool_capacity_bytes"},
	} {
		st, body := raw(tt.method, tt.path, tt.body, tt.auth)
		if st != tt.status || !strings.Contains(body, tt.contains) {
			t.Errorf("%s %s %s: %d %s; want %d containing %q", tt.method, tt.path, tt.body, st, body, tt.status, tt.contains)
		}
	}
	_, body := raw("GET", "/metrics", "", false)
	for _, m := range []string{"rmem_pool_used_bytes", `rmem_pool_slabs{state="free"}`, "rmem_pool_allocation_failures_total 1",
		`rmem_pool_server_heartbeat_age_seconds{server="a"}`, "rmem_pool_api_request_duration_seconds_bucket", "rmem_pool_lease_expiries_total"} {
		if !strings.Contains(body, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

func TestLoadToken(t *testing.T) {
	p := t.TempDir() + "/token"
	if _, err := client.LoadToken(p); err == nil {
		t.Fatal("missing file")
	}
	if err := writeFile(p, "abc\n"); err != nil {
		t.Fatal(err)
	}
	if tok, err := client.LoadToken(p); err != nil || tok != "abc" {
		t.Fatalf("%q %v", tok, err)
	}
	if _, err := client.New("ftp://x", client.Options{}); err == nil {
		t.Fatal("ftp URL accepted")
	}
}

// One agent (a client with the pool's token) cannot use another's lease:
// not list its slabs' keys, allocate, renew, free, replace or end it. The
// admin listings show no keys and no secret.
func TestLeaseSecret(t *testing.T) {
	ctx := context.Background()
	cl, _, _, url := serve(t)
	l, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "owner", TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Secret) < 32 || cl.LeaseSecret(l.ID) != l.Secret {
		t.Fatalf("lease secret %q, held %q", l.Secret, cl.LeaseSecret(l.ID))
	}
	slabs, err := cl.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 1, Replicas: 2})
	if err != nil || slabs[0].Replicas[0].Key == "" {
		t.Fatalf("owner's allocation: %v %+v", err, slabs)
	}
	other, err := client.New(url, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer other.CloseIdleConnections()
	sid := slabs[0].ID
	for name, call := range map[string]func() error{
		"slabs": func() error { _, err := other.LeaseSlabs(ctx, l.ID); return err },
		"allocate": func() error {
			_, err := other.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 1, Replicas: 1})
			return err
		},
		"renew":    func() error { _, err := other.Renew(ctx, l.ID, pool.RenewRequest{}); return err },
		"replace":  func() error { _, err := other.Replace(ctx, l.ID, sid, slabs[0].Replicas[0].Server); return err },
		"migrated": func() error { return other.Migrated(ctx, l.ID, sid, slabs[0].Replicas[0].Server) },
		"free":     func() error { return other.FreeSlab(ctx, l.ID, sid) },
		"delete":   func() error { return other.DeleteLease(ctx, l.ID) },
	} {
		var ce *client.Error
		if err := call(); !errors.Is(err, pool.ErrForbidden) || !errors.As(err, &ce) || ce.Status != 403 {
			t.Errorf("%s without the lease's secret: %v", name, err)
		}
	}
	other.SetLeaseSecret(l.ID, "0123456789abcdef0123456789abcdef")
	if _, err := other.LeaseSlabs(ctx, l.ID); !errors.Is(err, pool.ErrForbidden) {
		t.Errorf("a wrong secret: %v", err)
	}
	// Raw requests: the header is what counts.
	for _, secret := range []string{"", "x"} {
		req, _ := http.NewRequest("GET", url+"/v1/leases/"+string(l.ID)+"/slabs", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if secret != "" {
			req.Header.Set(pool.LeaseSecretHeader, secret)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || strings.Contains(string(body), string(slabs[0].Replicas[0].Key)) {
			t.Errorf("raw GET with secret %q: %d %s", secret, resp.StatusCode, body)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	// What the admin sees carries no key and no secret.
	views, err := other.Slabs(ctx, client.SlabFilter{Lease: l.ID})
	if err != nil || len(views) != 1 {
		t.Fatal(err, views)
	}
	for _, r := range views[0].Replicas {
		if r.Key != "" {
			t.Errorf("admin slab listing shows key %s", r.Key)
		}
	}
	ls, err := other.Leases(ctx)
	if err != nil || len(ls) != 1 || ls[0].Secret != "" {
		t.Fatalf("lease listing %+v %v", ls, err)
	}
	if lv, err := other.Lease(ctx, l.ID); err != nil || lv.Secret != "" {
		t.Fatalf("lease view %+v %v", lv, err)
	}
	// An agent taking the lease over with the secret its predecessor kept.
	other.SetLeaseSecret(l.ID, l.Secret)
	r, err := other.Renew(ctx, l.ID, pool.RenewRequest{})
	if err != nil || r.Lease.Secret != l.Secret {
		t.Fatalf("renew with the secret: %v, lease %+v", err, r.Lease)
	}
	got, err := other.LeaseSlabs(ctx, l.ID)
	if err != nil || got[0].Replicas[0].Key != slabs[0].Replicas[0].Key {
		t.Fatalf("slabs with the secret: %v %+v", err, got)
	}
	if err := other.DeleteLease(ctx, l.ID); err != nil || other.LeaseSecret(l.ID) != "" {
		t.Fatalf("delete with the secret: %v (secret still held: %q)", err, other.LeaseSecret(l.ID))
	}
}
