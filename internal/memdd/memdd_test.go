package memdd

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"rmem/pool"
	"rmem/pool/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const slab = 2 << 20

// daemon is a Run in the background.
type daemon struct {
	url  string // the control API, from the "control API listening" log line
	logs *observer.ObservedLogs
	stop func() error // cancels Run and returns what it returned
}

// start runs the daemon until the test ends or stop is called, and waits
// until the control API listens.
func start(t *testing.T, opts Options) *daemon {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, zap.New(core), opts) }()
	var once sync.Once
	var runErr error
	d := &daemon{logs: logs, stop: func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(20 * time.Second):
				runErr = errors.New("Run did not return within 20s of its context's end")
			}
		})
		return runErr
	}}
	t.Cleanup(func() { d.stop() })
	deadline := time.Now().Add(20 * time.Second)
	for d.url == "" {
		select {
		case err := <-done:
			t.Fatalf("Run returned before listening: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the control API did not listen within 20s")
		}
		if e := logs.FilterMessage("control API listening").All(); len(e) > 0 {
			d.url = "http://" + e[0].ContextMap()["addr"].(string)
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return d
}

func newClient(t *testing.T, url, token string) *client.Client {
	t.Helper()
	c, err := client.New(url, client.Options{Token: token, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// get fetches url without a token.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestRun: both roles in one process, as `memd serve` runs by default: a
// token is generated, the control API listens on the port it was given (0
// here) once this node's memory is in the pool, and the memory server
// leaves the pool before the coordinator stops.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	opts := Options{
		Listen: "127.0.0.1:0", NewTokenFile: filepath.Join(run, "token"), SlabSize: slab, ID: "n1",
		Coord: &CoordOptions{DataDir: filepath.Join(dir, "data"), HeartbeatTimeout: time.Second, SweepInterval: 100 * time.Millisecond},
		Server: &ServerOptions{Capacity: 2 * slab, TCPListen: "127.0.0.1:0",
			ShmSocket: filepath.Join(run, "memd-data.sock"), HeartbeatInterval: 100 * time.Millisecond},
	}
	d := start(t, opts)

	fi, err := os.Stat(opts.NewTokenFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	tok, err := client.LoadToken(opts.NewTokenFile)
	if err != nil || len(tok) != 64 {
		t.Fatalf("token %q: %v", tok, err)
	}
	if e := d.logs.FilterMessage("control API token written").All(); len(e) != 1 || e[0].ContextMap()["file"] != opts.NewTokenFile {
		t.Errorf("token log lines: %+v", e)
	}

	code, body := get(t, d.url+"/healthz")
	var health struct {
		Status string   `json:"status"`
		Roles  []string `json:"roles"`
	}
	if err := json.Unmarshal([]byte(body), &health); code != 200 || err != nil || strings.Join(health.Roles, ",") != "server,coordinator" {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get(t, d.url+"/v1/status"); code != http.StatusUnauthorized {
		t.Errorf("/v1/status without the token: %d %s", code, body)
	}
	// No waiting: the API serves only once the node's memory is in the pool.
	c := newClient(t, d.url, tok)
	ctx := context.Background()
	st, err := c.Status(ctx)
	if err != nil || st.ServersUp != 1 || st.Capacity != 2*slab {
		t.Fatalf("status %+v: %v", st, err)
	}
	ss, err := c.Servers(ctx)
	if err != nil || len(ss) != 1 {
		t.Fatalf("servers %+v: %v", ss, err)
	}
	if s := ss[0]; s.ID != "n1" || s.ControlURL != d.url || s.Addrs["tcp"] == "" || s.Addrs["shm"] != opts.Server.ShmSocket {
		t.Errorf("server %+v", s)
	}
	if code, body := get(t, d.url+"/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "rmem_") {
		t.Errorf("/metrics: %d, %d bytes", code, len(body))
	}

	if err := d.stop(); err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	if len(d.logs.FilterMessage("shutting down").All()) != 1 {
		t.Error("no \"shutting down\" log line")
	}

	// Again, coordinator only, on the same store and token file: the token
	// is the one written before, and n1 left the pool on the way out.
	opts.Server = nil
	d = start(t, opts)
	c = newClient(t, d.url, tok)
	ss, err = c.Servers(ctx)
	if err != nil || len(ss) != 1 || ss[0].State != pool.ServerLeft {
		t.Fatalf("servers after a stop: %+v %v", ss, err)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRunServerJoins: a memory server without the coordinator role joins the
// coordinator at CoordinatorURL, advertising its own control API, and leaves
// when stopped.
func TestRunServerJoins(t *testing.T) {
	dir := t.TempDir()
	const token = "memdd-test-token"
	co := start(t, Options{Listen: "127.0.0.1:0", Token: token, SlabSize: slab,
		Coord: &CoordOptions{DataDir: filepath.Join(dir, "data"), HeartbeatTimeout: time.Second, SweepInterval: 100 * time.Millisecond}})
	srv := start(t, Options{Listen: "127.0.0.1:0", Token: token, SlabSize: slab, ID: "s1",
		Server: &ServerOptions{CoordinatorURL: co.url, Capacity: slab, TCPListen: "127.0.0.1:0", HeartbeatInterval: 100 * time.Millisecond}})
	c := newClient(t, co.url, token)
	ctx := context.Background()
	servers := func(want pool.ServerState) []pool.ServerView {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ss, err := c.Servers(ctx)
			if err == nil && len(ss) == 1 && ss[0].State == want {
				return ss
			}
			if time.Now().After(deadline) {
				var said []string // what the server said of its joining and leaving
				for _, e := range srv.logs.All() {
					said = append(said, e.Message)
				}
				t.Fatalf("servers %+v %v, want one %s; the server logged %q", ss, err, want, said)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if s := servers(pool.ServerUp)[0]; s.ID != "s1" || s.ControlURL != srv.url {
		t.Errorf("server %+v", s)
	}
	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	servers(pool.ServerLeft)
	if err := co.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRunListenError: a control API address in use is an error naming the
// control API, with the errno kept.
func TestRunListenError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = Run(context.Background(), nil, Options{Listen: l.Addr().String(), Token: "x", SlabSize: slab,
		Coord: &CoordOptions{DataDir: t.TempDir(), HeartbeatTimeout: time.Second, SweepInterval: time.Second}})
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.HasPrefix(err.Error(), "control API: ") {
		t.Fatalf("Run on an address in use: %v", err)
	}
}

// TestRunInvalidOptions: options Run cannot start with fail before anything
// starts (no token file is written).
func TestRunInvalidOptions(t *testing.T) {
	good := func(dir string) Options {
		return Options{Listen: "127.0.0.1:0", NewTokenFile: filepath.Join(dir, "token"), SlabSize: slab, ID: "n1",
			Coord:  &CoordOptions{DataDir: dir, HeartbeatTimeout: time.Second, SweepInterval: time.Second},
			Server: &ServerOptions{Capacity: slab, TCPListen: "127.0.0.1:0", HeartbeatInterval: 100 * time.Millisecond}}
	}
	for _, tt := range []struct {
		name string
		edit func(o *Options)
		key  string // the field the error names
	}{
		{"no role", func(o *Options) { o.Coord, o.Server = nil, nil }, "Coord and Server"},
		{"no listen address", func(o *Options) { o.Listen = "" }, "Listen"},
		{"no data dir", func(o *Options) { o.Coord.DataDir = "" }, "Coord.DataDir"},
		{"no sweep interval", func(o *Options) { o.Coord.SweepInterval = 0 }, "Coord.SweepInterval"},
		{"no heartbeat timeout", func(o *Options) { o.Coord.HeartbeatTimeout = 0 }, "Coord.HeartbeatTimeout"},
		{"etcd without endpoints", func(o *Options) { o.Coord.Etcd = &EtcdOptions{} }, "Coord.Etcd.Endpoints"},
		{"etcd without an id", func(o *Options) { o.Coord.Etcd, o.ID = &EtcdOptions{Endpoints: []string{"127.0.0.1:1"}}, "" }, "ID"},
		{"no heartbeat interval", func(o *Options) { o.Server.HeartbeatInterval = 0 }, "Server.HeartbeatInterval"},
		{"server alone without a coordinator", func(o *Options) { o.Coord = nil }, "Server.CoordinatorURL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			o := good(dir)
			tt.edit(&o)
			err := Run(context.Background(), nil, o)
			if !errors.Is(err, ErrOptions) {
				t.Fatalf("Run: %v, want ErrOptions", err)
			}
			if !strings.Contains(err.Error(), ": "+tt.key) {
				t.Errorf("Run: %v, does not name %s", err, tt.key)
			}
			if _, err := os.Stat(o.NewTokenFile); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed start wrote the token file: %v", err)
			}
		})
	}
}

// TestWriteToken: a new token file is 0600 in a 0755 directory; when the
// file exists (another memd won the race), its token is returned.
func TestWriteToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "token")
	tok, err := writeToken(path)
	if err != nil || len(tok) != 64 {
		t.Fatalf("writeToken: %q %v", tok, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("token directory: %v %v", fi, err)
	}
	again, err := writeToken(path)
	if err != nil || again != tok {
		t.Fatalf("second writeToken: %q %v, want the first token %q", again, err, tok)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".token-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}

// TestLoopback: only "localhost" and loopback IPs are loopback; an empty
// host (every address) and a malformed address are not.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7470": true, "127.1.2.3:1": true, "[::1]:7470": true, "localhost:7470": true,
		":7470": false, "0.0.0.0:7470": false, "[::]:7470": false, "10.0.0.1:7470": false, "node-a:7470": false, "127.0.0.1": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
