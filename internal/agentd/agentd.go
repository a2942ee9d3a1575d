// Package agentd assembles the memagent daemon: a lease on the pool
// (pager/poolstore), the paging engine (pager.Agent) on its client socket,
// and an admin endpoint (HTTP on a root-only Unix socket) serving the
// per-process stats of `memagent stats` and the Prometheus metrics. Both
// `memagent serve` and `memagent run` (which starts an agent for the
// duration when none is running) use it.
//
// It holds no paging logic (package pager) and no pool logic (package
// pool); it only wires them and owns their lifetimes.
package agentd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/internal/cpuidle"
	"rmem/internal/metricsrv"
	"rmem/internal/spinmetrics"
	"rmem/pager"
	"rmem/pager/poolstore"
	"rmem/pool"
	"rmem/rdma"
	"rmem/spin"
	"rmem/userfaultfd"
)

// ErrNoCoordinator: the pool's coordinator did not answer.
var ErrNoCoordinator = errors.New("agentd: no coordinator reachable")

// DefaultAdminSocket is where memagent serves its stats by default.
const DefaultAdminSocket = "/run/rmem/memagent-admin.sock"

// Options configure a daemon.
type Options struct {
	Pool        poolstore.Pool // the coordinator's client; required
	Socket      string         // client socket (default proto.DefaultSocket)
	AllowUIDs   []uint32       // users served besides root and the daemon's own
	SocketGroup int            // group given the socket, whose members are served (0: none)
	AdminSocket string         // admin socket ("" for none)
	// MetricsListen is a TCP address (HOST:PORT) serving the agent's
	// /metrics for Prometheus ("" for none); the admin socket serves
	// them too, to root only.
	MetricsListen string
	LocalMem      uint64  // per-process budget; required
	NodeMem       uint64  // node-wide budget (0: none)
	MaxSlowdown   float64 // pager.Options.MaxSlowdown (0: fixed budgets)
	MinAlloc      uint64  // the shim's threshold (0: its default)
	Replicas      int     // 0: 2 when the pool has two servers up or more, else 1
	// Redundancy, when set, is how pages are kept instead of Replicas
	// (rep:N or ec:K+M, poolstore.Options.Redundancy).
	Redundancy pool.Redundancy
	Network    string        // rdma provider to reach memory servers (default "tcp")
	LeaseTTL   time.Duration // default 30s
	// FaultTimeout is pager.Options.FaultTimeout (0: its default).
	FaultTimeout time.Duration
	// Spin is pager.Options.Spin, for the data plane's connections too
	// (rdma.DialOptions.Spin).
	Spin time.Duration
	// StateDir is pager.Options.StateDir: with it, the lease and a
	// journal outlive the agent, and an agent started after it (within
	// the lease's TTL) takes them over and resumes its programs.
	StateDir string
	Log      *zap.Logger
	// Lock, when set, mlockall's the daemon (DESIGN.md pitfall 4: the agent
	// must not page itself); a failure is logged, not fatal.
	Lock bool
}

// Daemon is a running agent.
type Daemon struct {
	Agent    *pager.Agent
	Store    *poolstore.Store
	Replicas int // copies of a page (1 under ec: one shard)
	// Redundancy is how pages are kept (rep:N or ec:K+M).
	Redundancy pool.Redundancy
	Registry   *prometheus.Registry

	log      *zap.Logger
	spins    []*spin.Site // the agent's loops, its tcp clients: polling counted for stats and metrics
	stateDir string
	shared   bool // serves users besides root: the admin socket is open to them (their own stats)
	admin    *http.Server
	adml     net.Listener
	// stopMetrics stops the --metrics-listen server (nil: none);
	// MetricsAddr is its address.
	stopMetrics func()
	MetricsAddr string
	done        chan error
}

// Start takes a lease, opens the agent's socket and starts serving.
func Start(ctx context.Context, opts Options) (*Daemon, error) {
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	if opts.Pool == nil {
		return nil, errors.New("agentd: no pool client")
	}
	if opts.Lock {
		if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE | unix.MCL_ONFAULT); err != nil {
			log.Warn("mlockall failed: the agent's own memory may be swapped out", zap.Error(err))
		}
	}
	if p, err := cpuidle.Read("/sys"); err == nil && p.SlowWakeups() {
		if opts.Spin < 0 {
			log.Warn("slow CPU wake-ups, and --spin 0: " + p.Advice())
		} else {
			log.Info("idle vCPUs halt at once (cpuidle haltpoll, guest_halt_poll_ns 0): the fault path polls instead of sleeping while faults come (--spin)",
				zap.Duration("spin", spin.Resolve(opts.Spin)))
		}
	}
	// One status call first, so that a pool out of reach is said plainly
	// whatever the flags.
	st, err := opts.Pool.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w (is memd running? see --coordinator): %w", ErrNoCoordinator, err)
	}
	red := ResolveRedundancy(st, opts.Redundancy, opts.Replicas, log)
	replicas := max(red.Copies, 1)
	host, _ := os.Hostname()
	var adopt pool.LeaseID
	var secret string
	if opts.StateDir != "" {
		id, sec := pager.PreviousLease(opts.StateDir)
		adopt, secret = pool.LeaseID(id), sec
	}
	loopSpins, clientSpins := &spin.Site{Name: "agent-loop"}, &spin.Site{Name: "tcp-client"}
	store, err := poolstore.Open(ctx, poolstore.Options{
		Pool: opts.Pool, Agent: "memagent@" + host, Node: host, PID: os.Getpid(),
		TTL: opts.LeaseTTL, Replicas: replicas, Redundancy: red, Network: opts.Network, Log: log.Named("store"), Adopt: adopt, AdoptSecret: secret,
		Dial: rdma.DialOptions{Spin: opts.Spin, SpinSite: clientSpins}, SumDir: sumDir(opts.StateDir),
	})
	if err != nil {
		return nil, err
	}
	if opts.StateDir != "" {
		if !store.Adopted() {
			// The journal of a lease that is gone names slabs no one
			// holds: the next agent must not resume from it.
			os.RemoveAll(opts.StateDir)
		}
		if err := pager.SaveLease(opts.StateDir, string(store.Lease().ID), store.Lease().Secret); err != nil {
			store.Close(context.Background())
			return nil, fmt.Errorf("agentd: state dir: %w", err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), spinmetrics.Collector(loopSpins, clientSpins))
	registerIO(reg, store)
	if opts.Socket != "" {
		if err := os.MkdirAll(filepath.Dir(opts.Socket), 0o755); err != nil {
			store.Close(context.Background())
			return nil, fmt.Errorf("agentd: socket directory: %w", err)
		}
	}
	agent, err := pager.New(pager.Options{
		Socket: opts.Socket, SocketMode: socketMode(opts), AllowUIDs: opts.AllowUIDs, SocketGroup: opts.SocketGroup,
		Store: store, LocalMem: opts.LocalMem, NodeMem: opts.NodeMem, MaxSlowdown: opts.MaxSlowdown,
		MinAlloc: opts.MinAlloc, FaultTimeout: opts.FaultTimeout, Spin: opts.Spin, SpinSite: loopSpins, StateDir: opts.StateDir, Log: log.Named("pager"), Registry: reg,
		LoopsChanged: new(loopProcs).changed, // see procs.go
	})
	if err != nil {
		store.Close(context.Background())
		return nil, err
	}
	store.SetUsage(func() pool.RenewRequest {
		p := agent.Pool()
		r := pool.RenewRequest{Used: p.UsedBytes, NoRoom: p.NoRoom != ""}
		for _, c := range agent.Stats() {
			if c.Auto {
				r.Steered++
				r.SteeredBudget += c.BudgetBytes
				r.SteeredRemote += c.RemoteBytes
				r.MaxStallPct = max(r.MaxStallPct, c.StallPct)
			}
		}
		return r
	})
	d := &Daemon{Agent: agent, Store: store, spins: []*spin.Site{loopSpins, clientSpins}, stateDir: opts.StateDir, Replicas: replicas, Redundancy: red, Registry: reg, log: log, done: make(chan error, 1),
		shared: len(opts.AllowUIDs) > 0 || opts.SocketGroup != 0}
	if opts.AdminSocket != "" {
		if err := d.serveAdmin(opts.AdminSocket); err != nil {
			d.Close()
			return nil, err
		}
	}
	if opts.MetricsListen != "" {
		if d.MetricsAddr, d.stopMetrics, err = metricsrv.Serve(opts.MetricsListen, reg); err != nil {
			d.Close()
			return nil, fmt.Errorf("agentd: %w", err) // a *metricsrv.Error
		}
	}
	go func() { d.done <- agent.Run(context.Background()) }()
	log.Info("agent ready", zap.String("socket", agent.Addr()), zap.String("admin", opts.AdminSocket), zap.String("metrics", d.MetricsAddr),
		zap.Uint64("local_mem", opts.LocalMem), zap.Uint64("node_mem", opts.NodeMem), zap.Float64("max_slowdown", opts.MaxSlowdown), zap.Stringer("redundancy", red))
	return d, nil
}

// socketMode is 0660 (root and SocketGroup), or 0666 when AllowUIDs name
// users outside it: the agent checks every peer's credentials.
func socketMode(opts Options) os.FileMode {
	if len(opts.AllowUIDs) > 0 && opts.SocketGroup == 0 {
		return 0o666
	}
	return 0o660
}

// DefaultEC is how an agent that chose nothing keeps pages in a pool
// without a default of its own whose servers up span eight failure
// domains: two lost servers survived at 1.33x the bytes.
var DefaultEC = pool.Redundancy{K: 6, M: 2}

// ResolveRedundancy returns how an agent keeps pages: red (--redundancy)
// if set, else replicas copies (--replicas) if set, else the pool's
// default (ChooseRedundancy), else DefaultEC where the servers up span its
// failure domains, else ChooseReplicas'.
func ResolveRedundancy(st pool.Status, red pool.Redundancy, replicas int, log *zap.Logger) pool.Redundancy {
	switch {
	case red == (pool.Redundancy{}) && replicas == 0 && st.Redundancy != "":
		return ChooseRedundancy(st, log)
	case red == (pool.Redundancy{}) && replicas == 0 && st.Domains >= DefaultEC.Servers():
		log.Info("the pool's servers span enough failure domains: pages are erasure-coded (set --redundancy or --replicas to choose)",
			zap.Stringer("redundancy", DefaultEC), zap.Int("failure_domains", st.Domains))
		return DefaultEC
	case red == (pool.Redundancy{}):
		return pool.Redundancy{Copies: ChooseReplicas(st.ServersUp, replicas, log)}
	case red.EC() && red.Servers() > st.ServersUp:
		log.Warn("the pool has fewer memory servers up than a slab's shards: new slabs are copies until enough are up", zap.Stringer("redundancy", red),
			zap.Int("servers_up", st.ServersUp), zap.Int("needs", red.Servers()))
	case red.Servers() > st.ServersUp:
		log.Warn("the pool has fewer memory servers up than a slab's copies: new slabs wait for them", zap.Stringer("redundancy", red),
			zap.Int("servers_up", st.ServersUp), zap.Int("needs", red.Servers()))
	}
	return red
}

// ChooseRedundancy resolves the pool's default redundancy (memd serve
// --redundancy) for an agent that chose none: ec:K+M where the servers up
// span K+M failure domains, else M+1 copies (as many as there are
// servers, at most), with a warning.
func ChooseRedundancy(st pool.Status, log *zap.Logger) pool.Redundancy {
	red, err := pool.ParseRedundancy(st.Redundancy)
	if err != nil {
		log.Warn("the pool's default redundancy does not parse: choosing copies", zap.Error(err))
		return pool.Redundancy{Copies: ChooseReplicas(st.ServersUp, 0, log)}
	}
	if !red.EC() || st.Domains >= red.Servers() {
		return red
	}
	copies := max(1, min(red.M+1, st.ServersUp))
	log.Warn("the pool's default is erasure coding, but its servers up span fewer failure domains than a slab's shards: keeping copies",
		zap.Stringer("pool_default", red), zap.Int("failure_domains", st.Domains), zap.Int("copies", copies))
	return pool.Redundancy{Copies: copies}
}

// ChooseReplicas resolves a --replicas of 0: 2 where the pool has two or
// more servers up, else 1 with a warning.
func ChooseReplicas(serversUp, want int, log *zap.Logger) int {
	if want != 0 {
		return want
	}
	if serversUp >= 2 {
		return 2
	}
	log.Warn("the pool has fewer than two memory servers up: one replica per slab, so a memory server failure loses pages (set --replicas to choose)",
		zap.Int("servers_up", serversUp))
	return 1
}

// StatsResponse is the body of GET /v1/stats on the admin socket.
type StatsResponse struct {
	Clients  []pager.ClientStats `json:"clients"`
	Exited   []pager.ClientStats `json:"exited"`
	Replicas int                 `json:"replicas"`
	// Redundancy is how pages are kept: rep:N or ec:K+M.
	Redundancy string          `json:"redundancy"`
	Slabs      int             `json:"slabs"`
	Pool       pager.PoolStats `json:"pool"`
	// IO is what the agent's reads and writes of the pool met.
	IO IOStats `json:"io"`
	// Process is the agent's own CPU time (all its programs') and what of
	// it went to polling.
	Process ProcessCPU `json:"process"`
}

// ProcessCPU is the CPU time of this process and the part of it that its
// threads spent polling for their next event instead of sleeping
// (package spin, by kind of thread): the price of a fault path that does
// not wait for wake-ups. In `memagent run` with an agent of its own, the
// process is that agent (the program is its child, not counted).
type ProcessCPU struct {
	CPU  time.Duration    `json:"cpu_ns"`
	Spin []spin.SiteStats `json:"spin"`
}

// Polled is the CPU time all the process's threads spent polling.
func (p ProcessCPU) Polled() time.Duration {
	var d time.Duration
	for _, s := range p.Spin {
		d += s.Spun
	}
	return d
}

// ProcessCPU returns the process's ProcessCPU now, with the daemon's spin
// sites.
func (d *Daemon) ProcessCPU() ProcessCPU {
	var ru unix.Rusage
	p := ProcessCPU{Spin: make([]spin.SiteStats, 0, len(d.spins))}
	for _, s := range d.spins {
		p.Spin = append(p.Spin, s.Stats())
	}
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		p.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return p
}

// Stats returns what GET /v1/stats serves.
func (d *Daemon) Stats() StatsResponse {
	st := d.Store.Stats()
	return StatsResponse{Clients: d.Agent.Stats(), Exited: d.Agent.Exited(), Replicas: d.Replicas, Redundancy: d.Redundancy.String(), Slabs: st.Slabs,
		Pool: d.Agent.Pool(), Process: d.ProcessCPU(), IO: ioStats(st)}
}

// registerIO registers rmem_agent_pool_io_total: IOStats by event.
func registerIO(reg *prometheus.Registry, store *poolstore.Store) {
	for _, e := range []struct {
		name string
		get  func(IOStats) uint64
	}{
		{"failover", func(s IOStats) uint64 { return s.Failovers }},
		{"degraded_read", func(s IOStats) uint64 { return s.Degraded }},
		{"corrupt_copy", func(s IOStats) uint64 { return s.Corrupt }},
		{"repaired", func(s IOStats) uint64 { return s.Repaired }},
		{"lost", func(s IOStats) uint64 { return s.Lost }},
		{"restored", func(s IOStats) uint64 { return s.Restored }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rmem_agent_pool_io_total",
			Help:        "What the agent's reads and writes of the pool met, by event: reads moved to another replica (failover), pages rebuilt from their stripe (degraded_read), copies that failed their checksum (corrupt_copy), pages rewritten after one (repaired), pages with no good copy (lost), replicas or shards restored on another server (restored).",
			ConstLabels: prometheus.Labels{"event": e.name},
		}, func() float64 { return float64(e.get(ioStats(store.Stats()))) }))
	}
}

func ioStats(st poolstore.Stats) IOStats {
	return IOStats{Failovers: st.Failovers, Degraded: st.Degraded, Corrupt: st.Corrupt, Repaired: st.Repaired, Lost: st.Lost,
		Restored: st.Migrations, CopiedBytes: st.Copied}
}

// IOStats counts, over the agent's life, what its reads and writes of the
// pool met: reads moved to another replica after an error (failovers),
// pages of erasure-coded slabs rebuilt from the rest of their stripe
// (degraded), copies that failed their checksum (corrupt) and pages
// rewritten after one (repaired), pages with no good copy left (lost),
// and the replicas or shards restored on another server with the bytes
// copied or rebuilt for them.
type IOStats struct {
	Failovers   uint64 `json:"failovers"`
	Degraded    uint64 `json:"degraded_reads"`
	Corrupt     uint64 `json:"corrupt_copies"`
	Repaired    uint64 `json:"repaired"`
	Lost        uint64 `json:"lost"`
	Restored    uint64 `json:"restored"`
	CopiedBytes uint64 `json:"copied_bytes"`
}

func (d *Daemon) serveAdmin(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("agentd: admin socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("agentd: admin socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("agentd: admin socket: %w", err)
	}
	// Stats name processes and their memory use: root's, unless the agent
	// serves other users, who then see their own processes only.
	mode := os.FileMode(0o600)
	if d.shared {
		mode = 0o666
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return fmt.Errorf("agentd: admin socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		st := d.Stats()
		if uid, ok := r.Context().Value(peerUID{}).(uint32); !ok || !privileged(uid) {
			st = st.Of(uid)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	metrics := promhttp.HandlerFor(d.Registry, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if uid, ok := r.Context().Value(peerUID{}).(uint32); !ok || !privileged(uid) {
			http.Error(w, "the node's metrics are root's", http.StatusForbidden)
			return
		}
		metrics.ServeHTTP(w, r)
	})
	d.admin, d.adml = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ConnContext: withPeerUID}, ln
	go d.admin.Serve(ln)
	return nil
}

// peerUID keys the admin connection's peer uid (SO_PEERCRED) in its
// requests' context.
type peerUID struct{}

func withPeerUID(ctx context.Context, c net.Conn) context.Context {
	if uc, ok := c.(*net.UnixConn); ok {
		if cred, err := userfaultfd.PeerCred(uc); err == nil {
			return context.WithValue(ctx, peerUID{}, cred.Uid)
		}
	}
	return ctx
}

// privileged reports whether uid sees every process: root, or the agent's
// own user.
func privileged(uid uint32) bool { return uid == 0 || uid == uint32(os.Geteuid()) }

// Of returns the part of st about processes of user uid: an ordinary
// user's view of the admin socket.
func (st StatsResponse) Of(uid uint32) StatsResponse {
	own := func(rows []pager.ClientStats) []pager.ClientStats {
		out := []pager.ClientStats{}
		for _, r := range rows {
			if r.UID == uid {
				out = append(out, r)
			}
		}
		return out
	}
	st.Clients, st.Exited = own(st.Clients), own(st.Exited)
	return st
}

// Done is sent the agent's end (nil after Close).
func (d *Daemon) Done() <-chan error { return d.done }

// Close stops the admin endpoint and the agent. With a StateDir and
// programs still served, it leaves the lease and the journal to the agent
// started after it (they resume); else it ends the lease. Safe to call
// once.
func (d *Daemon) Close() error {
	if d.admin != nil {
		d.admin.Close()
	}
	if d.stopMetrics != nil {
		d.stopMetrics()
	}
	live := len(d.Agent.Stats())
	err := d.Agent.Close()
	if d.stateDir != "" && live > 0 {
		d.log.Info("programs still run: their pages and the lease are left to the next agent (it resumes them within the lease's TTL)",
			zap.Int("programs", live), zap.String("state_dir", d.stateDir))
		d.Store.Abandon()
		return err
	}
	if d.stateDir != "" {
		os.RemoveAll(d.stateDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e := d.Store.Close(ctx); e != nil && err == nil {
		err = e
	}
	return err
}

// FetchStats asks the agent behind the admin socket at path for its stats.
func FetchStats(ctx context.Context, path string) (StatsResponse, error) {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://memagent/v1/stats", nil)
	if err != nil {
		return StatsResponse{}, err
	}
	resp, err := hc.Do(req)
	if errors.Is(err, syscall.EACCES) {
		return StatsResponse{}, fmt.Errorf("%s is root's: this agent serves no other user, and its stats need root: %w", path, err)
	}
	if err != nil {
		return StatsResponse{}, fmt.Errorf("no memagent answering at %s (is 'memagent serve' running?): %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return StatsResponse{}, fmt.Errorf("memagent at %s: %s", path, resp.Status)
	}
	var out StatsResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return StatsResponse{}, fmt.Errorf("memagent at %s: %w", path, err)
	}
	return out, nil
}

// sumDir is where the pages' checksums are kept for the next agent
// (poolstore.Options.SumDir): beside the journal, or nowhere without one.
func sumDir(stateDir string) string {
	if stateDir == "" {
		return ""
	}
	return filepath.Join(stateDir, "sums")
}
