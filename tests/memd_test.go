package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/pool"
	"rmem/pool/client"
	"rmem/rdma"
	_ "rmem/rdma/shm"
	_ "rmem/rdma/tcp"
	"rmem/tests/internal/memdtest"
)

// The golden files of memd's --json output are rewritten with
// go test ./tests -run Memd -update.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files in tests/testdata")
	}
}

func memdUpdate() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

const (
	memdToken    = "integration-test-token"
	memdSlabSize = 16 << 20
)

type memdPool struct {
	t         *testing.T
	bin       string
	dir       string
	url       string
	coordArgs []string
	coord     *memdtest.Proc
	servers   map[string]*memdtest.Proc
	procs     []*memdtest.Proc // every process started, restarted ones too
	cl        *client.Client
}

func (p *memdPool) startCoordinator() {
	p.coord = memdtest.Start(p.t, "coordinator", p.bin, p.coordArgs...)
	p.procs = append(p.procs, p.coord)
	memdtest.Eventually(p.t, 20*time.Second, "coordinator up", func() error {
		if p.coord.Exited() {
			p.t.Fatalf("coordinator exited:\n%s", p.coord.Output())
		}
		_, err := p.cl.Status(context.Background())
		return err
	})
}

func (p *memdPool) startServer(id string) {
	args := []string{"serve", "--role", "server", "--id", id, "--coordinator", p.url, "--token", memdToken,
		"--listen", memdtest.FreeAddr(p.t), "--tcp-listen", "127.0.0.1:0", "--shm-socket", "off",
		"--capacity", "64MiB", "--slab-size", "16MiB", "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s",
		"--runtime-dir", filepath.Join(p.dir, "run-"+id), memdtest.MlockFlag(p.t, 64<<20)}
	p.servers[id] = memdtest.Start(p.t, id, p.bin, args...)
	p.procs = append(p.procs, p.servers[id])
}

func (p *memdPool) cli(args ...string) (string, error) {
	args = append(args, "--coordinator", p.url, "--token", memdToken)
	out, errOut, err := memdtest.Run(p.bin, nil, args...)
	if err != nil {
		return out, fmt.Errorf("memd %s: %v: %s", strings.Join(args, " "), err, errOut)
	}
	return out, nil
}

func newMemdPool(t *testing.T) *memdPool {
	t.Helper()
	p := &memdPool{t: t, bin: memdtest.Build(t), dir: t.TempDir(), servers: map[string]*memdtest.Proc{}}
	addr := memdtest.FreeAddr(t)
	p.url = "http://" + addr
	p.coordArgs = []string{"serve", "--role", "coordinator", "--listen", addr, "--token", memdToken,
		"--data-dir", filepath.Join(p.dir, "data"), "--runtime-dir", filepath.Join(p.dir, "run"),
		"--slab-size", "16MiB", "--heartbeat-timeout", "1s", "--sweep-interval", "100ms"}
	var err error
	if p.cl, err = client.New(p.url, client.Options{Token: memdToken, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cl.CloseIdleConnections)
	p.startCoordinator()
	for _, id := range []string{"s1", "s2", "s3"} {
		p.startServer(id)
	}
	memdtest.Eventually(t, 20*time.Second, "three servers up", func() error {
		ss, err := p.cl.Servers(context.Background())
		if err != nil {
			return err
		}
		up := 0
		for _, s := range ss {
			if s.State == pool.ServerUp {
				up++
			}
		}
		if up != 3 {
			return fmt.Errorf("%d servers up", up)
		}
		return nil
	})
	return p
}

// stackTrace matches a Go stack frame as zap's console encoder or a panic
// prints it ("\t/path/file.go:123").
var stackTrace = regexp.MustCompile(`\n\t\S+\.go:\d+`)

// memdLogsClean checks what the processes logged: no stack trace (those
// are for bugs, and everything here is an expected condition) and no
// message repeated every sweep.
func memdLogsClean(t *testing.T, procs []*memdtest.Proc) {
	t.Helper()
	for _, pr := range procs {
		out := pr.Output()
		if loc := stackTrace.FindStringIndex(out); loc != nil {
			t.Errorf("%s logged a stack trace:\n%s", pr.Name, out[max(0, loc[0]-400):min(len(out), loc[1]+400)])
		}
		if n := strings.Count(out, "free failed"); n > 1 {
			t.Errorf("%s logged %d failed frees", pr.Name, n)
		}
	}
}

// golden compares memd's --json output, with volatile fields replaced, to
// tests/testdata/NAME.golden.
func memdGolden(t *testing.T, name, out string, volatile ...string) {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%s: output is not JSON: %v\n%s", name, err, out)
	}
	vol := map[string]bool{}
	for _, k := range volatile {
		vol[k] = true
	}
	var norm func(v any) any
	norm = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if vol[k] {
					x[k] = "<" + k + ">"
				} else {
					x[k] = norm(e)
				}
			}
		case []any:
			for i := range x {
				x[i] = norm(x[i])
			}
		}
		return v
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(norm(v)); err != nil {
		t.Fatal(err)
	}
	got := buf.Bytes()
	path := filepath.Join("testdata", name+".golden")
	if memdUpdate() {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s (run with -update if the change is intended)\ngot:\n%s\nwant:\n%s", name, path, got, want)
	}
}

func memdDialReplica(t *testing.T, r pool.ReplicaView) (rdma.Conn, rdma.Key) {
	t.Helper()
	c, err := rdma.Dial(context.Background(), "tcp", r.Addrs["tcp"], rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	k, err := rdma.ParseKey(string(r.Key))
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func memdPattern(slab pool.SlabID) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("slab-%04d", slab)), 4096/9+1)[:4096]
}

// TestMemdPool runs a coordinator and three memory servers as real
// processes on loopback and exercises the pool end to end.
func TestMemdPool(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx := context.Background()
	p := newMemdPool(t)

	out, err := p.cli("servers", "--json")
	if err != nil {
		t.Fatal(err)
	}
	memdGolden(t, "memd_servers", out, "instance", "registered", "last_heartbeat", "heartbeat_age", "addrs", "control_url", "load")

	lease, err := p.cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "agent-1", Node: "node-a", PID: 4242, TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	// Placement draws servers at random; with s3 draining meanwhile every
	// slab gets one replica on s1 and one on s2, so the drain of s1 below
	// has a replica of each slab to move (to s3), whatever the draws.
	if _, err := p.cli("drain", "s3", "--no-wait"); err != nil {
		t.Fatal(err)
	}
	slabs, err := p.cl.Allocate(ctx, lease.ID, pool.AllocateRequest{Slabs: 3, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.cli("undrain", "s3"); err != nil {
		t.Fatal(err)
	}
	// Write each slab's pattern to both replicas through rdma, read it back.
	for _, s := range slabs {
		if len(s.Replicas) != 2 || s.Replicas[0].Server == s.Replicas[1].Server {
			t.Fatalf("slab %d replicas %+v", s.ID, s.Replicas)
		}
		for _, r := range s.Replicas {
			c, k := memdDialReplica(t, r)
			if err := rdma.Write(ctx, c, k, memdSlabSize-4096, memdPattern(s.ID)); err != nil {
				t.Fatalf("write slab %d on %s: %v", s.ID, r.Server, err)
			}
			got := make([]byte, 4096)
			if err := rdma.Read(ctx, c, k, memdSlabSize-4096, got); err != nil || !bytes.Equal(got, memdPattern(s.ID)) {
				t.Fatalf("read back slab %d on %s: %v", s.ID, r.Server, err)
			}
		}
	}

	t.Run("cli json", func(t *testing.T) {
		for _, tt := range []struct {
			args     []string
			name     string
			volatile []string
		}{
			{[]string{"status", "--json"}, "memd_status", []string{"url"}},
			{[]string{"agents", "--json"}, "memd_agents", []string{"id", "created", "expires"}},
			{[]string{"slabs", "--json", "--agent", "agent-1"}, "memd_slabs", []string{"lease", "created", "server", "index", "addrs"}},
		} {
			out, err := p.cli(tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			memdGolden(t, tt.name, out, tt.volatile...)
		}
		for _, args := range [][]string{{"status"}, {"servers"}, {"agents"}, {"slabs", "--server", "s1"}} {
			out, err := p.cli(args...)
			if err != nil || !strings.Contains(out, "\n") {
				t.Fatalf("memd %v: %q %v", args, out, err)
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		if _, err := p.cl.Allocate(ctx, lease.ID, pool.AllocateRequest{Slabs: 50, Replicas: 1}); !errors.Is(err, pool.ErrNoCapacity) {
			t.Errorf("allocation beyond the pool: %v", err)
		}
		if _, err := p.cli("drain", "nosuch", "--no-wait"); err == nil || !strings.Contains(err.Error(), "nosuch") {
			t.Errorf("drain of an unknown server: %v", err)
		}
		_, errOut, err := memdtest.Run(p.bin, nil, "status", "--coordinator", p.url, "--token", "wrong")
		if err == nil || !strings.Contains(errOut, "401") {
			t.Errorf("bad token: %v %s", err, errOut)
		}
		req, _ := http.NewRequest("POST", p.url+"/v1/leases", strings.NewReader(`{"agent": "x", "ttl": 5}x`))
		req.Header.Set("Authorization", "Bearer "+memdToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"error"`) {
			t.Errorf("malformed JSON: %d %s", resp.StatusCode, body)
		}
		http.DefaultClient.CloseIdleConnections()
	})

	t.Run("another agent", func(t *testing.T) {
		// Another agent has the pool's token but not the lease's secret:
		// it learns no key of agent-1's slabs and cannot use its lease.
		other, err := client.New(p.url, client.Options{Token: memdToken, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer other.CloseIdleConnections()
		if _, err := other.LeaseSlabs(ctx, lease.ID); !errors.Is(err, pool.ErrForbidden) {
			t.Fatalf("another agent listing agent-1's slabs: %v", err)
		}
		if _, err := other.Allocate(ctx, lease.ID, pool.AllocateRequest{Slabs: 1, Replicas: 1}); !errors.Is(err, pool.ErrForbidden) {
			t.Fatalf("another agent allocating on agent-1's lease: %v", err)
		}
		if err := other.DeleteLease(ctx, lease.ID); !errors.Is(err, pool.ErrForbidden) {
			t.Fatalf("another agent ending agent-1's lease: %v", err)
		}
		// Nor does any admin listing show a key or the secret.
		for _, args := range [][]string{{"slabs", "--json"}, {"agents", "--json"}} {
			out, err := p.cli(args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range slabs {
				for _, r := range s.Replicas {
					if strings.Contains(out, string(r.Key)) {
						t.Fatalf("memd %v shows a key", args)
					}
				}
			}
			if strings.Contains(out, lease.Secret) || strings.Contains(out, `"secret"`) {
				t.Fatalf("memd %v shows the lease secret", args)
			}
		}
		// Nor can it go to a memory server's control endpoint with the
		// pool's token and have agent-1's slab re-granted (revoked and
		// zeroed): grant and free want the coordinator's control secret,
		// which no view shows.
		r := slabs[0].Replicas[0]
		sv, err := p.cl.Server(ctx, r.Server)
		if err != nil {
			t.Fatal(err)
		}
		if sv.ControlURL == "" || sv.ControlSecret != "" {
			t.Fatalf("server %s view: control URL %q, secret %q", r.Server, sv.ControlURL, sv.ControlSecret)
		}
		ms, err := client.NewMemServer(sv.ControlURL, "", client.Options{Token: memdToken, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer ms.CloseIdleConnections()
		if _, err := ms.Grant(ctx, sv.Instance, 1<<40, []pool.SlabIndex{r.Index}); !errors.Is(err, pool.ErrForbidden) {
			t.Fatalf("another agent granting agent-1's slab on %s: %v", r.Server, err)
		}
		if err := ms.Free(ctx, sv.Instance, []pool.FreeEntry{{Index: r.Index, Key: r.Key}}); !errors.Is(err, pool.ErrForbidden) {
			t.Fatalf("another agent freeing agent-1's slab on %s: %v", r.Server, err)
		}
		survived(t, survRow{scenario: "another tenant", injected: "an agent with the pool's token asks for agent-1's keys, its lease, and a grant/free of its slab at the memory server",
			outcome: "forbidden (403) each time, no key shown, slab exact", lost: "0"})
		c, k := memdDialReplica(t, r)
		page := make([]byte, 4096)
		if err := rdma.Read(ctx, c, k, memdSlabSize-4096, page); err != nil || !bytes.Equal(page, memdPattern(slabs[0].ID)) {
			t.Fatalf("agent-1's slab after another agent's grant and free: %v", err)
		}
		// The holder, in another process after a restart, takes it over
		// with the secret it kept.
		other.SetLeaseSecret(lease.ID, lease.Secret)
		got, err := other.LeaseSlabs(ctx, lease.ID)
		if err != nil || len(got) != 3 || got[0].Replicas[0].Key != slabs[0].Replicas[0].Key {
			t.Fatalf("with the secret: %v %+v", err, got)
		}
	})

	t.Run("drain", func(t *testing.T) {
		if _, err := p.cli("drain", "s1", "--no-wait"); err != nil {
			t.Fatal(err)
		}
		// Follow the drain with the CLI while an agent (this test) moves
		// its replicas: copy the data to the replacement, report it done.
		follow := make(chan error, 1)
		var followOut string
		go func() {
			var err error
			followOut, err = p.cli("drain", "s1", "--json")
			follow <- err
		}()
		r, err := p.cl.Renew(ctx, lease.ID, pool.RenewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		moved := 0
		for _, ev := range r.Events {
			if ev.Type != pool.EventReplicaDrain || ev.Server != "s1" {
				t.Fatalf("event %+v", ev)
			}
			var old pool.ReplicaView
			for _, s := range slabs {
				for _, rep := range s.Replicas {
					if s.ID == ev.Slab && rep.Server == "s1" {
						old = rep
					}
				}
			}
			nr, err := p.cl.Replace(ctx, lease.ID, ev.Slab, ev.Server)
			if err != nil {
				t.Fatal(err)
			}
			if nr.Server == "s1" {
				t.Fatal("replacement on the draining server")
			}
			oc, ok := memdDialReplica(t, old)
			nc, nk := memdDialReplica(t, nr)
			buf := make([]byte, 4096)
			if err := rdma.Read(ctx, oc, ok, memdSlabSize-4096, buf); err != nil {
				t.Fatal(err)
			}
			if err := rdma.Write(ctx, nc, nk, memdSlabSize-4096, buf); err != nil {
				t.Fatal(err)
			}
			if err := p.cl.Migrated(ctx, lease.ID, ev.Slab, ev.Server); err != nil {
				t.Fatal(err)
			}
			// The old replica's key is revoked once the migration is
			// done: the coordinator frees it behind its answer.
			memdtest.Eventually(t, 20*time.Second, "old replica revoked after migration", func() error {
				if err := rdma.Read(ctx, oc, ok, 0, buf[:8]); !errors.Is(err, rdma.ErrRevokedKey) {
					return fmt.Errorf("read: %v", err)
				}
				return nil
			})
			moved++
		}
		if moved != len(slabs) {
			t.Fatalf("moved %d replicas off s1, want %d (one per slab)", moved, len(slabs))
		}
		select {
		case err := <-follow:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("memd drain did not see the drain finish")
		}
		memdGolden(t, "memd_drain", followOut)
		// Every slab still reads its data, now from s2 and s3.
		cur, err := p.cl.LeaseSlabs(ctx, lease.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range cur {
			for _, rep := range s.Replicas {
				if rep.Server == "s1" {
					t.Fatalf("slab %d still on s1", s.ID)
				}
				c, k := memdDialReplica(t, rep)
				got := make([]byte, 4096)
				if err := rdma.Read(ctx, c, k, memdSlabSize-4096, got); err != nil || !bytes.Equal(got, memdPattern(s.ID)) {
					t.Fatalf("slab %d on %s after drain: %v", s.ID, rep.Server, err)
				}
			}
		}
		slabs = cur
	})

	t.Run("kill -9 server", func(t *testing.T) {
		p.servers["s3"].Kill()
		took := memdtest.Eventually(t, 15*time.Second, "s3 reported dead", func() error {
			s, err := p.cl.Server(ctx, "s3")
			if err != nil {
				return err
			}
			if s.State != pool.ServerDead {
				return fmt.Errorf("s3 is %s", s.State)
			}
			return nil
		})
		t.Logf("s3 reported dead %v after kill -9 (heartbeat timeout 1s)", took)
		r, err := p.cl.Renew(ctx, lease.ID, pool.RenewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		lost := 0
		for _, ev := range r.Events {
			if ev.Type == pool.EventReplicaLost && ev.Server == "s3" {
				lost++
			}
		}
		if lost != 3 {
			t.Fatalf("%d lost-replica events for s3, want 3 (one per slab): %+v", lost, r.Events)
		}
		st, _ := p.cl.Status(ctx)
		if st.ServersDown != 1 || st.SlabsDegraded != 3 {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("impossible drain", func(t *testing.T) {
		// s1 is draining, s3 dead: nothing can take s2's replicas. memd
		// drain says why and exits non-zero instead of waiting forever.
		start := time.Now()
		out, err := p.cli("drain", "s2")
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "cannot finish") || !strings.Contains(err.Error(), "nowhere to go") {
			t.Fatalf("memd drain s2 with no destination: %v\n%s", err, out)
		}
		if !strings.Contains(out, "3 with nowhere to go") {
			t.Errorf("progress lines do not say the replicas are blocked:\n%s", out)
		}
		t.Logf("memd drain s2 gave up after %v: %v", took.Round(time.Millisecond), err)
		var v pool.DrainView
		if out, err := p.cli("drain", "s2", "--no-wait", "--json"); err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Blocked != 3 || v.Reason == "" {
			t.Fatalf("drain view %s: %v", out, err)
		}
		if _, err := p.cli("undrain", "s2"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("restart coordinator", func(t *testing.T) {
		before, err := p.cl.Slabs(ctx, client.SlabFilter{})
		if err != nil {
			t.Fatal(err)
		}
		beforeLeases, _ := p.cl.Leases(ctx)
		p.coord.Kill()
		// s2 cannot heartbeat the new coordinator while stopped: it must be
		// reported unknown, not up, and its replicas not ok. A long
		// heartbeat timeout keeps it from being declared dead meanwhile
		// (and lets the restarted s1 below show that it rejoins at once).
		p.servers["s2"].Signal(syscall.SIGSTOP)
		p.coordArgs = append(p.coordArgs, "--heartbeat-timeout", "30s")
		p.startCoordinator()
		memdtest.Eventually(t, 10*time.Second, "s1 up, s2 unknown, s3 dead", func() error {
			ss, err := p.cl.Servers(ctx)
			if err != nil {
				return err
			}
			var got []string
			for _, s := range ss {
				got = append(got, string(s.ID)+"="+string(s.State))
			}
			if g := strings.Join(got, " "); g != "s1=up s2=unknown s3=dead" {
				return errors.New(g)
			}
			return nil
		})
		st, err := p.cl.Status(ctx)
		if err != nil || st.ServersUp != 1 || st.ServersUnknown != 1 || st.ServersDown != 1 || st.SlabsHealthy != 0 || st.SlabsUnknown != 3 {
			t.Fatalf("status while s2 is not heard from: %+v %v", st, err)
		}
		if out, err := p.cli("status"); err != nil || !strings.Contains(out, "1 unknown") || !strings.Contains(out, "3 unknown") {
			t.Fatalf("memd status while s2 is not heard from: %v\n%s", err, out)
		}
		if out, err := p.cli("servers"); err != nil || !regexp.MustCompile(`(?m)^s2\s+unknown\s.*none since the coordinator started`).MatchString(out) {
			t.Fatalf("memd servers while s2 is not heard from: %v\n%s", err, out)
		}
		unknown, err := p.cl.Slabs(ctx, client.SlabFilter{Server: "s2"})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range unknown {
			for _, r := range s.Replicas {
				if want := map[pool.ServerID]string{"s2": "unknown", "s3": "lost"}[r.Server]; r.State != want {
					t.Fatalf("slab %d replica on %s is %s, want %s", s.ID, r.Server, r.State, want)
				}
			}
		}
		p.servers["s2"].Signal(syscall.SIGCONT)
		memdtest.Eventually(t, 10*time.Second, "s2 up once it heartbeats", func() error {
			s, err := p.cl.Server(ctx, "s2")
			if err == nil && s.State != pool.ServerUp {
				err = fmt.Errorf("s2 is %s", s.State)
			}
			return err
		})
		after, err := p.cl.Slabs(ctx, client.SlabFilter{})
		if err != nil {
			t.Fatal(err)
		}
		b1, _ := json.Marshal(before)
		b2, _ := json.Marshal(after)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("slabs after restart:\n%s\nbefore:\n%s", b2, b1)
		}
		afterLeases, _ := p.cl.Leases(ctx)
		if len(afterLeases) != 1 || afterLeases[0].ID != beforeLeases[0].ID || afterLeases[0].Slabs != 3 {
			t.Fatalf("leases after restart %+v", afterLeases)
		}
		if _, err := p.cl.Renew(ctx, lease.ID, pool.RenewRequest{}); err != nil {
			t.Fatalf("renew after restart: %v", err)
		}
		// The surviving servers keep heartbeating the new process.
		memdtest.Eventually(t, 10*time.Second, "s1, s2 up after restart", func() error {
			st, err := p.cl.Status(ctx)
			if err != nil {
				return err
			}
			if st.ServersUp != 2 || st.ServersDown != 1 {
				return fmt.Errorf("%+v", st)
			}
			return nil
		})
		// Keys handed out before the restart still work.
		for _, s := range slabs {
			for _, rep := range s.Replicas {
				if rep.Server == "s3" {
					continue
				}
				c, k := memdDialReplica(t, rep)
				got := make([]byte, 4096)
				if err := rdma.Read(ctx, c, k, memdSlabSize-4096, got); err != nil || !bytes.Equal(got, memdPattern(s.ID)) {
					t.Fatalf("slab %d on %s after coordinator restart: %v", s.ID, rep.Server, err)
				}
			}
		}
		// kill -9 of s1 and a new s1 at once: its old instance does not
		// answer at its control URL any more, so the new one joins without
		// waiting for the (30s) heartbeat timeout.
		old, err := p.cl.Server(ctx, "s1")
		if err != nil {
			t.Fatal(err)
		}
		p.servers["s1"].Kill()
		p.startServer("s1")
		took := memdtest.Eventually(t, 10*time.Second, "the restarted s1 registered", func() error {
			s, err := p.cl.Server(ctx, "s1")
			if err == nil && (s.Instance == old.Instance || s.State != pool.ServerUp) {
				err = fmt.Errorf("s1 is %s, instance %s", s.State, s.Instance)
			}
			return err
		})
		t.Logf("a restarted s1 rejoined %v after kill -9 (heartbeat timeout 30s)", took)
		// A refused registration logs this warning (and is retried); "409"
		// alone would also match a log line's timestamp.
		if out := p.servers["s1"].Output(); strings.Contains(out, "registering with the coordinator") {
			t.Errorf("the restarted s1 was refused first:\n%s", out)
		}
		// Ending the lease revokes the keys.
		if err := p.cl.DeleteLease(ctx, lease.ID); err != nil {
			t.Fatal(err)
		}
		rep := slabs[0].Replicas[0]
		if rep.Server == "s3" {
			rep = slabs[0].Replicas[1]
		}
		c, k := memdDialReplica(t, rep)
		if err := rdma.Read(ctx, c, k, 0, make([]byte, 8)); !errors.Is(err, rdma.ErrRevokedKey) {
			t.Fatalf("key after the lease ended: %v", err)
		}
	})
	// Servers killed, stopped, refused grants and restarted, a coordinator
	// restarted: all expected, none worth a stack trace.
	memdLogsClean(t, p.procs)
}

// TestMemdSingleNode: memd serve with only directories given binds the
// control API to loopback, writes a root-only token, and the CLI finds it.
func TestMemdSingleNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := memdtest.Build(t)
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	addr := memdtest.FreeAddr(t)
	serveArgs := []string{"serve", "--listen", addr, "--runtime-dir", run, "--data-dir", filepath.Join(dir, "data"),
		"--capacity", "32MiB", "--slab-size", "16MiB", "--tcp-listen", "127.0.0.1:0", memdtest.MlockFlag(t, 32<<20)}
	proc := memdtest.Start(t, "memd", bin, serveArgs...)
	var out string
	memdtest.Eventually(t, 20*time.Second, "memd status with the generated token", func() error {
		var err error
		out, _, err = memdtest.Run(bin, nil, "status", "--json", "--coordinator", "http://"+addr, "--runtime-dir", run)
		return err
	})
	var st pool.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Capacity != 32<<20 || st.ServersUp != 1 {
		t.Fatalf("status %q %v", out, err)
	}
	fi, err := os.Stat(filepath.Join(run, "token"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi.Mode(), err)
	}
	// An agent on this host: token from the file, data through shm.
	tok, err := client.LoadToken(filepath.Join(run, "token"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New("http://"+addr, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.CloseIdleConnections()
	ctx := context.Background()
	l, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "local", TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	slabs, err := cl.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 2, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep := slabs[1].Replicas[0]
	if want := filepath.Join(run, "memd-data.sock"); rep.Addrs["shm"] != want {
		t.Fatalf("shm address %q, want %q", rep.Addrs["shm"], want)
	}
	if fi, err := os.Stat(rep.Addrs["shm"]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("shm socket: %v %v", fi.Mode(), err)
	}
	tc, k := memdDialReplica(t, rep)
	if err := rdma.Write(ctx, tc, k, 4096, memdPattern(slabs[1].ID)); err != nil {
		t.Fatal(err)
	}
	sc, err := rdma.Dial(ctx, "shm", rep.Addrs["shm"], rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	got := make([]byte, 4096)
	if err := rdma.Read(ctx, sc, k, 4096, got); err != nil || !bytes.Equal(got, memdPattern(slabs[1].ID)) {
		t.Fatalf("read over shm what was written over tcp: %v", err)
	}
	if err := cl.DeleteLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if err := rdma.Read(ctx, sc, k, 4096, got); !errors.Is(err, rdma.ErrRevokedKey) {
		t.Fatalf("shm read after the lease ended: %v", err)
	}

	// A lease that is not renewed expires: its keys are revoked, its slabs
	// zeroed and free again.
	short, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "forgetful", TTL: pool.Duration(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	slabs, err = cl.Allocate(ctx, short.ID, pool.AllocateRequest{Slabs: 2, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	c2, k2 := memdDialReplica(t, slabs[0].Replicas[0])
	if err := rdma.Write(ctx, c2, k2, 0, []byte("left behind")); err != nil {
		t.Fatal(err)
	}
	took := memdtest.Eventually(t, 15*time.Second, "lease expiry frees the slabs", func() error {
		st, err := cl.Status(ctx)
		if err != nil {
			return err
		}
		if st.Agents != 0 || st.Used != 0 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	t.Logf("unrenewed 300ms lease freed after %v", took)
	if err := rdma.Read(ctx, c2, k2, 0, got[:8]); !errors.Is(err, rdma.ErrRevokedKey) {
		t.Fatalf("key of an expired lease: %v", err)
	}
	// The next tenant of the same memory reads zeros.
	l3, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "next", TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	slabs, err = cl.Allocate(ctx, l3.ID, pool.AllocateRequest{Slabs: 2, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slabs {
		c3, k3 := memdDialReplica(t, s.Replicas[0])
		if err := rdma.Read(ctx, c3, k3, 0, got[:11]); err != nil || !bytes.Equal(got[:11], make([]byte, 11)) {
			t.Fatalf("next tenant reads %q, %v", got[:11], err)
		}
	}

	// kill -9 and start again: the same token, the lease is still there,
	// its replicas are reported lost (the memory went with the process),
	// and the new instance's memory is all free.
	proc.Kill()
	memdtest.Start(t, "memd-restarted", bin, serveArgs...)
	memdtest.Eventually(t, 20*time.Second, "restarted memd up", func() error {
		st, err := cl.Status(ctx)
		if err == nil && st.ServersUp != 1 {
			err = fmt.Errorf("%+v", st)
		}
		return err
	})
	r, err := cl.Renew(ctx, l3.ID, pool.RenewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Events) != 2 || r.Events[0].Type != pool.EventReplicaLost {
		t.Fatalf("events after restart: %+v", r.Events)
	}
	if st, _ := cl.Status(ctx); st.Free != 32<<20 || st.SlabsLost != 2 {
		t.Fatalf("status after restart: %+v", st)
	}
	_, errOut, err := memdtest.Run(bin, nil, "status", "--coordinator", "http://"+addr, "--runtime-dir", filepath.Join(dir, "elsewhere"))
	if err == nil || !strings.Contains(errOut, "token") {
		t.Fatalf("CLI without a token: %v %s", err, errOut)
	}
}

// TestMemdBadConfig: invalid settings fail before anything starts, naming
// the key and where its value came from.
// TestMemdStartOrder: a memory server started before its coordinator, as
// two units started together are, waits for the token file the
// coordinator writes and for the coordinator, saying so once, and joins.
func TestMemdStartOrder(t *testing.T) {
	bin, dir := memdtest.Build(t), t.TempDir()
	addr, run := memdtest.FreeAddr(t), filepath.Join(dir, "run")
	s := memdtest.Start(t, "s1", bin, "serve", "--role", "server", "--id", "s1", "--coordinator", "http://"+addr,
		"--token-file", filepath.Join(run, "token"), "--listen", memdtest.FreeAddr(t), "--tcp-listen", "127.0.0.1:0",
		"--shm-socket", "off", "--capacity", "32MiB", "--slab-size", "16MiB", "--heartbeat-interval", "200ms",
		"--runtime-dir", filepath.Join(dir, "run-s1"), memdtest.MlockFlag(t, 32<<20))
	time.Sleep(2 * time.Second)
	if s.Exited() {
		t.Fatalf("the server did not wait for its coordinator:\n%s", s.Output())
	}
	memdtest.Start(t, "coordinator", bin, "serve", "--role", "coordinator", "--listen", addr, "--runtime-dir", run,
		"--data-dir", filepath.Join(dir, "data"), "--slab-size", "16MiB")
	memdtest.Eventually(t, 30*time.Second, "the early server up", func() error {
		if s.Exited() {
			t.Fatalf("the server exited:\n%s", s.Output())
		}
		out, _, err := memdtest.Run(bin, nil, "servers", "--json", "--coordinator", "http://"+addr, "--token-file", filepath.Join(run, "token"))
		if err != nil {
			return err
		}
		if !strings.Contains(out, `"state": "up"`) {
			return errors.New("not up")
		}
		return nil
	})
	if n := strings.Count(s.Output(), "waiting for the token file"); n != 1 {
		t.Errorf("said %d times that it waits for the token file, want once:\n%s", n, s.Output())
	}
	// memd top --once shows it.
	out, errOut, err := memdtest.Run(bin, nil, "top", "--once", "--coordinator", "http://"+addr, "--token-file", filepath.Join(run, "token"))
	if err != nil || !strings.HasPrefix(out, "memd top - ") || !regexp.MustCompile(`(?m)^s1 +up +32\.0M`).MatchString(out) {
		t.Errorf("memd top --once: %v\n%s%s", err, out, errOut)
	}
}

func TestMemdBadConfig(t *testing.T) {
	bin := memdtest.Build(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "memd.yaml")
	os.WriteFile(cfg, []byte("slab-size: 3MiB\n"), 0o600)
	openToken := filepath.Join(dir, "open-token")
	os.WriteFile(openToken, []byte("a-token-long-enough-for-a-network\n"), 0o644)
	os.Chmod(openToken, 0o644)
	base := []string{"serve", "--runtime-dir", filepath.Join(dir, "run"), "--data-dir", filepath.Join(dir, "data"), "--listen", memdtest.FreeAddr(t)}
	for _, tt := range []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"bad size", []string{"--capacity", "lots"}, nil, []string{"capacity", "flag --capacity", "lots"}},
		{"capacity beyond free memory", []string{"--capacity", "100TiB"}, nil, []string{"capacity", "MemAvailable"}},
		{"bad percentage", []string{"--capacity", "95%"}, nil, []string{"capacity", "percentage"}},
		{"bad role", []string{"--role", "boss"}, nil, []string{"role", "boss"}},
		{"timeout below interval", []string{"--heartbeat-interval", "2s", "--heartbeat-timeout", "1s"}, nil, []string{"heartbeat-timeout"}},
		{"env", nil, []string{"MEMD_SWEEP_INTERVAL=often"}, []string{"sweep-interval", "MEMD_SWEEP_INTERVAL"}},
		{"config file", []string{"--config", cfg}, nil, []string{"slab-size", "memd.yaml", "2MiB"}},
		{"server without coordinator", []string{"--role", "server", "--token", "x"}, nil, []string{"coordinator"}},
		{"server without token", []string{"--role", "server", "--coordinator", "http://127.0.0.1:1", "--connect-timeout", "300ms"}, nil, []string{"token"}},
		{"non-loopback without token", []string{"--listen", "0.0.0.0:0"}, nil, []string{"listen", "token"}},
		{"non-loopback short token", []string{"--listen", "0.0.0.0:0"}, []string{"MEMD_TOKEN=x"}, []string{"token", "at least 16 bytes"}},
		{"non-loopback readable token file", []string{"--listen", "0.0.0.0:0", "--token-file", openToken}, nil, []string{"token-file", openToken, "0644"}},
		{"bad coordinator url", []string{"--role", "server", "--token", "x", "--coordinator", "ftp://x"}, nil, []string{"coordinator"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, err := memdtest.Run(bin, tt.env, append(append([]string{}, base...), tt.args...)...)
			if err == nil {
				t.Fatal("memd serve accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("error %q does not mention %q", errOut, w)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "run", "token")); err == nil {
		t.Error("a failed start wrote a token file")
	}
}

// TestMemdDataPlaneWarning: a tcp data plane on every address, with no
// authentication of its own, is said so at start.
func TestMemdDataPlaneWarning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := memdtest.Build(t)
	dir := t.TempDir()
	addr := memdtest.FreeAddr(t)
	proc := memdtest.Start(t, "memd", bin, "serve", "--listen", addr, "--runtime-dir", filepath.Join(dir, "run"),
		"--data-dir", filepath.Join(dir, "data"), "--capacity", "16MiB", "--slab-size", "16MiB", "--tcp-listen", "0.0.0.0:0",
		"--shm-socket", "off", memdtest.MlockFlag(t, 16<<20))
	memdtest.Eventually(t, 20*time.Second, "memd up", func() error {
		if proc.Exited() {
			t.Fatalf("memd exited:\n%s", proc.Output())
		}
		_, errOut, err := memdtest.Run(bin, nil, "status", "--coordinator", "http://"+addr, "--runtime-dir", filepath.Join(dir, "run"))
		if err != nil {
			return fmt.Errorf("%v: %s", err, errOut)
		}
		return nil
	})
	if out := proc.Output(); !strings.Contains(out, "WARN") || !strings.Contains(out, "tcp data plane listens on a non-loopback address without authentication") {
		t.Fatalf("no warning about the open data plane:\n%s", out)
	}
}

// TestMemdMTLS: with mTLS the control API may listen on every address
// without a configured token, and only clients with a certificate from the
// CA get in.
func TestMemdMTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := memdtest.Build(t)
	dir := t.TempDir()
	pki := memdtest.NewPKI(t, dir)
	_, port, _ := strings.Cut(memdtest.FreeAddr(t), ":")
	memdtest.Start(t, "memd", bin, "serve", "--listen", "0.0.0.0:"+port, "--runtime-dir", filepath.Join(dir, "run"),
		"--data-dir", filepath.Join(dir, "data"), "--capacity", "32MiB", "--slab-size", "16MiB", "--tcp-listen", "127.0.0.1:0",
		"--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--tls-client-ca", pki.CA, "--tls-ca", pki.CA,
		memdtest.MlockFlag(t, 32<<20))
	url := "https://127.0.0.1:" + port
	nowhere := filepath.Join(dir, "no-token-here")
	memdtest.Eventually(t, 20*time.Second, "memd status over mTLS", func() error {
		_, errOut, err := memdtest.Run(bin, nil, "status", "--coordinator", url, "--runtime-dir", nowhere,
			"--tls-ca", pki.CA, "--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey)
		if err != nil {
			return fmt.Errorf("%v: %s", err, errOut)
		}
		return nil
	})
	// A client without a certificate is refused even with the token.
	tok, err := os.ReadFile(filepath.Join(dir, "run", "token"))
	if err != nil {
		t.Fatal(err)
	}
	_, errOut, err := memdtest.Run(bin, nil, "status", "--coordinator", url, "--token", strings.TrimSpace(string(tok)), "--tls-ca", pki.CA)
	if err == nil {
		t.Fatalf("a client without a certificate got in: %s", errOut)
	}
}
