package memdd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"rmem/internal/spinmetrics"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/coord"
	"rmem/pool/coord/elect"
	"rmem/pool/httpapi"
	"rmem/pool/memserver"
	"rmem/pool/store"
	"rmem/rdma"
	_ "rmem/rdma/shm"   // same-host data plane
	_ "rmem/rdma/tcp"   // the default data-plane provider
	_ "rmem/rdma/verbs" // without the verbs build tag, a stand-in that names the missing tag
	"rmem/spin"
)

// ErrOptions is wrapped by errors about Options.
var ErrOptions = errors.New("memdd: invalid options")

// Options configure a memd daemon: what both roles share, and one group
// per role, nil when the role does not run. cmd/memd has checked every value
// against its flag; Run checks only what it cannot start without.
type Options struct {
	// Listen is the control API's address, HOST:PORT (port 0: any free one).
	Listen string
	// AdvertiseURL is the control URL the coordinator reaches this memory
	// server at, and the one a coordinator on etcd is known by; "" is
	// http(s)://<the listener's address>.
	AdvertiseURL string
	// Token is the control API's bearer token ("" only with mTLS).
	Token string
	// NewTokenFile, when set, is where Run writes a new token (0600, its
	// directory 0755) before it listens; that token replaces Token. If
	// another memd created the file first, its token is used instead.
	NewTokenFile string
	// ServerTLS is served by the control API (nil: plain HTTP). When it
	// requires and verifies client certificates (mTLS), a verified client
	// needs no token.
	ServerTLS *tls.Config
	// ClientTLS is used to reach the coordinator and memory servers.
	ClientTLS *tls.Config
	SlabSize  uint64 // a positive multiple of 2MiB, the same on every node
	// ID names this node: the memory server's id in the pool, and the
	// coordinator's among several (etcd).
	ID string

	Coord  *CoordOptions  // the coordinator role (nil: not run)
	Server *ServerOptions // the memory-server role (nil: not run)
}

// CoordOptions configure the coordinator role.
type CoordOptions struct {
	DataDir string // its store's directory (bbolt file memd.db), without Etcd
	// Etcd, when set, keeps the coordinator's state in etcd instead: this
	// coordinator is one of several, elected leader in turn.
	Etcd             *EtcdOptions
	HeartbeatTimeout time.Duration // a server silent this long is dead
	// Redundancy is the pool's default for agents that choose none
	// (coord.Options.Redundancy).
	Redundancy    string
	SweepInterval time.Duration // how often to look for dead servers and expired leases
}

// EtcdOptions configure a coordinator's state in etcd.
type EtcdOptions struct {
	Endpoints   []string
	Prefix      string        // its keys' prefix
	MaxTxnOps   int           // etcd's --max-txn-ops (0: its default, 128)
	ElectionTTL time.Duration // the leader's etcd lease, whole seconds (0: 5s)
}

// ServerOptions configure the memory-server role.
type ServerOptions struct {
	// CoordinatorURL is the coordinators to join (comma-separated);
	// required without the coordinator role. Beside a coordinator on etcd,
	// more coordinators to find the leader through.
	CoordinatorURL    string
	Capacity          uint64 // bytes donated: whole slabs
	Domain            string // failure domain
	TCPListen         string // data-plane tcp address ("": none)
	TCPAdvertise      string // tcp address registered for agents ("": the listener's)
	VerbsListen       string // data-plane verbs set-up address ("": none)
	ShmSocket         string // data-plane shm socket ("": none)
	ShmOptional       bool   // the shm socket was not asked for: run without it if it cannot start
	HeartbeatInterval time.Duration
	Mlock             bool // lock the donated memory in RAM
	// Spin is rdma.ListenOptions.Spin for the data plane.
	Spin time.Duration
	// ConnectTimeout bounds, without the coordinator role, how long the
	// server waits for its first registration with the coordinator
	// before Run fails (0: for ever). It retries meanwhile: a coordinator
	// started beside it may come up after it.
	ConnectTimeout time.Duration
}

// validate checks what Run cannot start without, naming the field.
func (o *Options) validate() error {
	switch {
	case o.Coord == nil && o.Server == nil:
		return fmt.Errorf("%w: Coord and Server are nil: neither role", ErrOptions)
	case o.Listen == "":
		return fmt.Errorf("%w: Listen: no control API address", ErrOptions)
	case o.Coord != nil && o.Coord.Etcd != nil && o.ID == "":
		return fmt.Errorf("%w: ID: a coordinator on etcd needs one", ErrOptions)
	}
	if o.Coord != nil {
		if err := o.Coord.validate(); err != nil {
			return fmt.Errorf("%w: Coord.%w", ErrOptions, err)
		}
	}
	if o.Server != nil {
		if err := o.Server.validate(o.Coord != nil); err != nil {
			return fmt.Errorf("%w: Server.%w", ErrOptions, err)
		}
	}
	return nil
}

func (o *CoordOptions) validate() error {
	switch {
	case o.Etcd == nil && o.DataDir == "":
		return errors.New("DataDir: the coordinator has no data directory (nor Etcd)")
	case o.Etcd != nil && len(o.Etcd.Endpoints) == 0:
		return errors.New("Etcd.Endpoints: none")
	case o.HeartbeatTimeout <= 0:
		return errors.New("HeartbeatTimeout: must be positive")
	case o.SweepInterval <= 0:
		return errors.New("SweepInterval: must be positive")
	}
	return nil
}

func (o *ServerOptions) validate(withCoord bool) error {
	switch {
	case o.HeartbeatInterval <= 0:
		return errors.New("HeartbeatInterval: must be positive")
	case !withCoord && o.CoordinatorURL == "":
		return errors.New("CoordinatorURL: a memory server without the coordinator role needs the coordinator's URL")
	}
	return nil
}

// Run runs the daemon until ctx is done (it then returns nil) or the
// control API fails. Whatever it started is stopped when it returns.
func Run(ctx context.Context, log *zap.Logger, opts Options) (err error) {
	if log == nil {
		log = zap.NewNop()
	}
	if err := opts.validate(); err != nil {
		return err
	}
	if opts.NewTokenFile != "" {
		if opts.Token, err = writeToken(opts.NewTokenFile); err != nil {
			return err
		}
		log.Info("control API token written", zap.String("file", opts.NewTokenFile))
	}
	mtls := opts.ServerTLS != nil && opts.ServerTLS.ClientAuth == tls.RequireAndVerifyClientCert
	// Listen first: the memory server registers the actual address (an
	// ephemeral port in tests).
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	defer ln.Close()
	if opts.AdvertiseURL == "" {
		scheme := "http"
		if opts.ServerTLS != nil {
			scheme = "https"
		}
		opts.AdvertiseURL = scheme + "://" + ln.Addr().String()
	}
	reg := prometheus.NewRegistry()
	serverSpins := &spin.Site{Name: "tcp-server"} // the data plane's connections
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), spinmetrics.Collector(serverSpins))
	api := http.NewServeMux()
	roles := []string{}

	var ms *memserver.Server
	if sv := opts.Server; sv != nil {
		listen := map[string]string{}
		optional := map[string]bool{}
		if sv.TCPListen != "" {
			listen["tcp"] = sv.TCPListen
		}
		if sv.VerbsListen != "" {
			listen["verbs"] = sv.VerbsListen
		}
		if sv.ShmSocket != "" {
			if err := os.MkdirAll(filepath.Dir(sv.ShmSocket), 0o755); err != nil {
				return fmt.Errorf("shm socket directory: %w", err)
			}
			listen["shm"] = sv.ShmSocket
			optional["shm"] = sv.ShmOptional
		}
		ms, err = memserver.New(memserver.Options{
			ID: pool.ServerID(opts.ID), Capacity: sv.Capacity, SlabSize: opts.SlabSize,
			Listen: listen, Optional: optional, Advertise: map[string]string{"tcp": sv.TCPAdvertise},
			ControlURL: opts.AdvertiseURL, Domain: sv.Domain, NoLock: !sv.Mlock, Log: log.Named("memserver"),
			ListenOptions: rdma.ListenOptions{Spin: sv.Spin, SpinSite: serverSpins},
		})
		if err != nil {
			return err
		}
		defer ms.Close()
		if a := sv.TCPListen; a != "" && !Loopback(a) {
			// The data plane has no credentials of its own (memd sets no
			// data-plane TLS): only the slab keys protect it.
			log.Warn("the tcp data plane listens on a non-loopback address without authentication or encryption: anyone who can reach it may connect, slab keys are its only protection, and keys and pages cross the network in clear; listen on a private network only",
				zap.String("addr", a))
		}
		if err := ms.RegisterMetrics(reg); err != nil {
			return err
		}
		ms.Routes(api)
		roles = append(roles, "server")
	}

	var co *coord.Coordinator // the only coordinator (bbolt)
	var ld *leader            // one of several (etcd)
	gatherers := prometheus.Gatherers{reg}
	if cr := opts.Coord; cr != nil {
		dialOpts := client.Options{Token: opts.Token, TLS: opts.ClientTLS, Timeout: 10 * time.Second, RetryFor: -1}
		dialer := coord.DialerFunc(func(info *pool.ServerInfo) (coord.SlabServer, error) {
			if ms != nil && info.ID == pool.ServerID(opts.ID) && info.Instance == ms.Instance() {
				return ms, nil
			}
			if info.ControlURL == "" {
				return nil, fmt.Errorf("server %s registered no control URL", info.ID)
			}
			return client.NewMemServer(info.ControlURL, info.ControlSecret, dialOpts)
		})
		coordOpts := func(st store.Store, term coord.Term, r *prometheus.Registry) coord.Options {
			return coord.Options{Store: st, Term: term, Dialer: dialer, SlabSize: opts.SlabSize,
				HeartbeatTimeout: cr.HeartbeatTimeout, Redundancy: cr.Redundancy, Log: log.Named("coord"), Registry: r}
		}
		if cr.Etcd == nil {
			st, err := store.OpenBolt(cr.DataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			co, err = coord.New(coordOpts(st, nil, reg))
			if err != nil {
				return err
			}
			defer co.Close()
			if err := co.Routes(api); err != nil {
				return err
			}
			self := pool.CoordinatorView{ID: opts.ID, URL: opts.AdvertiseURL, Leader: true}
			api.HandleFunc("GET /v1/coordinators", func(w http.ResponseWriter, r *http.Request) {
				httpapi.WriteJSON(w, http.StatusOK, pool.Coordinators{Store: "bbolt", Self: opts.ID, Leader: &self, Coordinators: []pool.CoordinatorView{self}})
			})
		} else {
			st, err := store.OpenEtcd(store.EtcdOptions{Endpoints: cr.Etcd.Endpoints, Prefix: cr.Etcd.Prefix, MaxTxnOps: cr.Etcd.MaxTxnOps,
				Log: log.Named("etcd").WithOptions(zap.IncreaseLevel(zap.WarnLevel))})
			if err != nil {
				return err
			}
			defer st.Close()
			self := elect.Info{ID: opts.ID, URL: opts.AdvertiseURL}
			el, err := elect.New(elect.Options{Client: st.Client(), Prefix: st.Prefix(), Self: self, TTL: cr.Etcd.ElectionTTL, Log: log.Named("elect")})
			if err != nil {
				return err
			}
			ld = &leader{log: log.Named("coord"), st: st, el: el, self: self, newOpts: coordOpts, sweep: cr.SweepInterval,
				leading: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "rmem", Subsystem: "pool", Name: "coordinator_leader",
					Help: "1 while this coordinator leads the pool (etcd), else 0."})}
			reg.MustRegister(ld.leading)
			gatherers = append(gatherers, ld)
			api.HandleFunc("GET /v1/coordinators", func(w http.ResponseWriter, r *http.Request) {
				httpapi.WriteJSON(w, http.StatusOK, ld.coordinators(r))
			})
			api.Handle("/", ld)
		}
		roles = append(roles, "coordinator")
	}
	if ld == nil {
		api.HandleFunc("/", httpapi.NotFound)
	}

	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{}))
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "roles": roles})
	})
	root.Handle("/", httpapi.Auth(opts.Token, mtls, api))
	hs := &http.Server{Handler: root, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, TLSConfig: opts.ServerTLS,
		ErrorLog: zap.NewStdLog(log.Named("http"))}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sweepDone, joinDone, leadDone chan struct{}
	// Without the coordinator role: the first registration, awaited up
	// to ConnectTimeout (nil channels: not awaited).
	var joinReady <-chan struct{}
	var joinTimeout <-chan time.Time
	var joinErr atomic.Pointer[error]
	if co != nil {
		sweepDone = make(chan struct{})
		go func() { defer close(sweepDone); co.RoutineSweep(runCtx, opts.Coord.SweepInterval) }()
	}
	// The lead loop outlives the memory server's leave (it may be the
	// leader the leave goes to).
	leadCtx, leadCancel := context.WithCancel(context.Background())
	defer leadCancel()
	if ld != nil {
		leadDone = make(chan struct{})
		go func() { defer close(leadDone); ld.RoutineLead(leadCtx) }()
	}
	if ms != nil {
		var regr memserver.Registrar
		if co != nil {
			regr = localRegistrar{co}
		} else {
			// Over etcd this node's own coordinator is one of those to
			// try: it names the leader when it is not.
			urls := opts.Server.CoordinatorURL
			if ld != nil {
				urls = strings.Trim(opts.AdvertiseURL+","+urls, ",")
				urls = dedupURLs(urls)
			}
			cl, err := client.New(urls, client.Options{Token: opts.Token, TLS: opts.ClientTLS, Timeout: 10 * time.Second})
			if err != nil {
				cancel()
				return err
			}
			defer cl.CloseIdleConnections()
			regr = cl
		}
		joinDone = make(chan struct{})
		ready := make(chan struct{})
		var failed func(error)
		if co == nil && opts.Server.ConnectTimeout > 0 {
			joinReady = ready
			failed = func(err error) { joinErr.Store(&err) }
			t := time.NewTimer(opts.Server.ConnectTimeout)
			defer t.Stop()
			joinTimeout = t.C
		}
		go func() {
			defer close(joinDone)
			ms.RoutineJoin(runCtx, regr, opts.Server.HeartbeatInterval, ready, failed)
		}()
		if co != nil {
			// In one process, serve only once this node's memory is in the
			// pool: a client that can reach the API finds it there.
			select {
			case <-ready:
			case <-ctx.Done():
			}
		}
	}
	httpDone := make(chan error, 1)
	go func() {
		if opts.ServerTLS != nil {
			httpDone <- hs.ServeTLS(ln, "", "")
		} else {
			httpDone <- hs.Serve(ln)
		}
	}()
	log.Info("control API listening", zap.String("addr", ln.Addr().String()), zap.Strings("roles", roles))

	for stop := false; !stop; {
		stop = true
		select {
		case <-ctx.Done():
			log.Info("shutting down")
		case err = <-httpDone:
			err = fmt.Errorf("control API: %w", err)
		case <-joinReady:
			joinReady, joinTimeout, stop = nil, nil, false
		case <-joinTimeout:
			select {
			case <-joinReady: // registered as the time ran out
				joinReady, joinTimeout, stop = nil, nil, false
				continue
			default:
			}
			why := errors.New("no answer yet")
			if e := joinErr.Load(); e != nil {
				why = *e
			}
			err = fmt.Errorf("no coordinator reachable at %s within --connect-timeout %s (is the coordinator running? see --coordinator): %w",
				opts.Server.CoordinatorURL, opts.Server.ConnectTimeout, why)
		}
	}
	cancel()
	if joinDone != nil {
		<-joinDone // leaves the pool while the coordinator still runs
	}
	if sweepDone != nil {
		<-sweepDone
	}
	leadCancel()
	if leadDone != nil {
		select {
		case <-leadDone: // resigned: another coordinator leads at once
		case <-time.After(3 * time.Second):
			// etcd does not answer: a campaign's clean-up waits on the
			// client's own context, which closing the client ends.
			ld.st.Close()
			<-leadDone
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	return err
}

// Loopback reports whether HOST:PORT listens on loopback only ("localhost"
// or a loopback IP; an empty host is every address). cmd/memd asks it of
// the control API's address: off loopback, its token must be configured.
func Loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// dedupURLs drops repeated entries of a comma-separated URL list.
func dedupURLs(list string) string {
	seen := map[string]bool{}
	var out []string
	for _, u := range strings.Split(list, ",") {
		u = strings.TrimRight(strings.TrimSpace(u), "/")
		if u != "" && !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return strings.Join(out, ",")
}

// writeToken creates the token file (0600) atomically; its directory is
// created 0755 (the shm socket lives there too).
func writeToken(path string) (string, error) {
	tok := pool.RandomHex(32)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("token directory: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err == nil {
		_, err = tmp.WriteString(tok + "\n")
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp.Name(), path) // fails if another memd won the race
	}
	if errors.Is(err, os.ErrExist) {
		return client.LoadToken(path)
	}
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	return tok, nil
}

// localRegistrar adapts an in-process coordinator to memserver.Registrar.
type localRegistrar struct{ c *coord.Coordinator }

var _ memserver.Registrar = localRegistrar{}

// Register registers the local server. A live-looking older instance of
// the same id can only be this process's predecessor (killed before it could
// leave): it is marked gone first.
func (r localRegistrar) Register(_ context.Context, info pool.ServerInfo) (pool.Server, error) {
	rec, err := r.c.Register(info)
	if errors.Is(err, pool.ErrConflict) {
		if err := r.c.Leave(info.ID); err != nil {
			return rec, err
		}
		rec, err = r.c.Register(info)
	}
	return rec, err
}
func (r localRegistrar) Heartbeat(_ context.Context, id pool.ServerID, hb pool.Heartbeat) error {
	return r.c.Heartbeat(id, hb)
}
func (r localRegistrar) Leave(_ context.Context, id pool.ServerID) error { return r.c.Leave(id) }
