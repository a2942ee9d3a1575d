package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"rmem/internal/cli"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/coord"
	"rmem/pool/httpapi"
	"rmem/pool/memserver"
	"rmem/pool/store"
	_ "rmem/rdma/shm" // same-host data plane
	_ "rmem/rdma/tcp" // the default data-plane provider
	"rmem/rdma/verbs"
)

// Default addresses and paths (docs/api.md).
const (
	defaultListen     = "127.0.0.1:7470"
	defaultTCPListen  = "127.0.0.1:7471"
	defaultRuntimeDir = "/run/rmem"
	defaultDataDir    = "/var/lib/rmem"
	shmSocketName     = "memd-data.sock"
	tokenFileName     = "token"
)

func addCommonFlags(f interface {
	String(name, value, usage string) *string
}) {
	f.String("token", "", "bearer token of the control API (env MEMD_TOKEN); default: read from --token-file")
	f.String("token-file", "", "file holding the token (default <runtime-dir>/token)")
	f.String("runtime-dir", defaultRuntimeDir, "runtime directory: token file, shm socket")
	f.String("tls-ca", "", "CA bundle to verify an https coordinator (and memory servers)")
	f.String("tls-cert", "", "certificate: served by the control API, and presented as client certificate (mTLS)")
	f.String("tls-key", "", "private key of --tls-cert")
}

func newServeCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a memory server and/or the pool coordinator",
		Long: `serve donates --capacity of this node's RAM to the pool (memory-server role)
and coordinates the pool (coordinator role). With no flags both roles run,
the control API listens on 127.0.0.1:7470, the data plane on
127.0.0.1:7471 (tcp) and <runtime-dir>/memd-data.sock (shm), and a token is
generated in <runtime-dir>/token for the CLI and memagent on this host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := readServeConfig(app)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, app.Log(), cfg)
		},
	}
	f := cmd.Flags()
	f.String("role", "all", "roles to run: all (memory server + coordinator), server, or coordinator")
	f.String("listen", defaultListen, "control API address (HTTP); a non-loopback address needs a configured token or mTLS")
	f.String("advertise-url", "", "control URL the coordinator uses to reach this memory server (default http(s)://<listen>)")
	f.String("coordinator", "", "coordinator URL, for --role server (env MEMD_COORDINATOR)")
	f.String("id", "", "this memory server's id in the pool (default: the host name)")
	f.String("capacity", "1GiB", "memory to donate: a size (4GiB) or a percentage of RAM (25%)")
	f.String("slab-size", "64MiB", "slab size, the unit of allocation (a multiple of 2MiB; the same on every node)")
	f.String("failure-domain", "", "failure domain (rack, zone) of this server: replicas of a slab avoid sharing one")
	f.String("tcp-listen", defaultTCPListen, "data-plane tcp address (\"off\" disables)")
	f.String("tcp-advertise", "", "tcp address registered for agents (default: the listener's address)")
	f.String("shm-socket", "", "data-plane shm socket (default <runtime-dir>/memd-data.sock; \"off\" disables)")
	f.String("verbs-listen", "off", "data-plane RDMA verbs set-up address IP:PORT on an RDMA device's IP (needs a memd built with -tags verbs; docs/rdma-hardware.md)")
	f.String("data-dir", defaultDataDir, "coordinator metadata directory (bbolt file memd.db)")
	f.String("heartbeat-interval", "2s", "memory server heartbeat interval")
	f.String("heartbeat-timeout", "10s", "coordinator: a server silent this long is dead")
	f.String("sweep-interval", "1s", "coordinator: how often to look for dead servers and expired leases")
	f.String("mlock", "true", "lock donated memory in RAM (needs RLIMIT_MEMLOCK ≥ capacity, or root)")
	f.String("tls-client-ca", "", "require client certificates signed by this CA (mTLS) on the control API")
	addCommonFlags(f)
	return cmd
}

type serveConfig struct {
	coordRole, serverRole bool
	listen                string
	advertiseURL          string // "": scheme://<the control listener's address>
	scheme                string
	coordinator           string
	id                    string
	capacity, slabSize    uint64
	domain                string
	tcpListen, tcpAdv     string
	verbsListen           string
	shmSocket             string
	shmDefault            bool // shm-socket not configured: run without shm if it cannot start
	dataDir               string
	hbInterval, hbTimeout time.Duration
	sweep                 time.Duration
	mlock                 bool
	token                 string
	tokenFile             string
	generateToken         bool
	serverTLS             *tls.Config // nil: plain HTTP
	clientTLS             *tls.Config
	mtls                  bool
}

func isLoopback(hostport string) bool {
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

// readServeConfig reads and validates every serve option before anything starts.
func readServeConfig(app *cli.App) (*serveConfig, error) {
	c := &serveConfig{}
	role, err := app.OneOf("role", "all", "server", "coordinator")
	if err != nil {
		return nil, err
	}
	c.coordRole, c.serverRole = role != "server", role != "coordinator"
	c.listen = app.String("listen")
	if _, port, err := net.SplitHostPort(c.listen); err != nil || port == "" {
		return nil, app.Invalid("listen", "want HOST:PORT")
	}
	if c.slabSize, err = sizeOf(app, "slab-size"); err != nil {
		return nil, err
	}
	if c.slabSize == 0 || c.slabSize%(2<<20) != 0 {
		return nil, app.Invalid("slab-size", "must be a positive multiple of 2MiB")
	}
	if c.hbInterval, err = positive(app, "heartbeat-interval"); err != nil {
		return nil, err
	}
	if c.hbTimeout, err = positive(app, "heartbeat-timeout"); err != nil {
		return nil, err
	}
	if c.coordRole && c.serverRole && c.hbTimeout <= c.hbInterval {
		return nil, app.Invalid("heartbeat-timeout", "must be longer than heartbeat-interval (%s)", c.hbInterval)
	}
	if c.sweep, err = positive(app, "sweep-interval"); err != nil {
		return nil, err
	}
	if c.mlock, err = app.Bool("mlock"); err != nil {
		return nil, err
	}
	runtimeDir := app.String("runtime-dir")
	if !filepath.IsAbs(runtimeDir) {
		return nil, app.Invalid("runtime-dir", "must be an absolute path")
	}
	c.dataDir = app.String("data-dir")
	if c.coordRole && !filepath.IsAbs(c.dataDir) {
		return nil, app.Invalid("data-dir", "must be an absolute path")
	}
	c.tokenFile = app.String("token-file")
	if c.tokenFile == "" {
		c.tokenFile = filepath.Join(runtimeDir, tokenFileName)
	}
	if c.serverTLS, c.clientTLS, err = readTLS(app, true); err != nil {
		return nil, err
	}
	c.mtls = c.serverTLS != nil && c.serverTLS.ClientAuth == tls.RequireAndVerifyClientCert

	c.token = strings.TrimSpace(app.String("token"))
	configured := c.token != "" || app.IsSet("token-file")
	if c.token == "" {
		tok, err := client.LoadToken(c.tokenFile)
		switch {
		case err == nil:
			c.token = tok
		case errors.Is(err, os.ErrNotExist) && c.coordRole:
			c.generateToken = true
		case errors.Is(err, os.ErrNotExist) && !c.mtls:
			return nil, app.Invalid("token", "--role server needs the coordinator's token (--token, MEMD_TOKEN, or --token-file; %s does not exist)", c.tokenFile)
		case !errors.Is(err, os.ErrNotExist):
			return nil, app.Invalid("token-file", "%v", err)
		}
	}
	if !isLoopback(c.listen) && !configured && !c.mtls {
		return nil, app.Invalid("listen", "listening on a non-loopback address needs a configured token (--token, MEMD_TOKEN, --token-file) or mTLS (--tls-cert, --tls-key, --tls-client-ca)")
	}
	scheme := "http"
	if c.serverTLS != nil {
		scheme = "https"
	}
	c.scheme = scheme
	c.advertiseURL = app.String("advertise-url")
	if c.advertiseURL != "" {
		if u, err := url.Parse(c.advertiseURL); err != nil || u.Host == "" {
			return nil, app.Invalid("advertise-url", "want http(s)://HOST:PORT")
		}
	}

	if c.serverRole {
		c.coordinator = app.String("coordinator")
		if role == "server" {
			if c.coordinator == "" {
				return nil, app.Invalid("coordinator", "--role server needs the coordinator's URL")
			}
			if _, err := client.New(c.coordinator, client.Options{}); err != nil {
				return nil, app.Invalid("coordinator", "%v", err)
			}
		}
		if c.capacity, err = capacityOf(app, c.slabSize); err != nil {
			return nil, err
		}
		c.id = app.String("id")
		if c.id == "" {
			if c.id, err = os.Hostname(); err != nil {
				return nil, app.Invalid("id", "no host name to default to: %v", err)
			}
		}
		if err := (&pool.ServerInfo{ID: pool.ServerID(c.id), Instance: "x", SlabSize: c.slabSize, Addrs: map[string]string{"x": "x"}}).Validate(); err != nil {
			return nil, app.Invalid("id", "%v", err)
		}
		c.domain = app.String("failure-domain")
		c.tcpListen, c.tcpAdv = app.String("tcp-listen"), app.String("tcp-advertise")
		if c.tcpListen != "off" {
			if _, _, err := net.SplitHostPort(c.tcpListen); err != nil {
				return nil, app.Invalid("tcp-listen", "want HOST:PORT or off")
			}
		}
		c.verbsListen = app.String("verbs-listen")
		if c.verbsListen != "off" {
			if _, _, err := net.SplitHostPort(c.verbsListen); err != nil {
				return nil, app.Invalid("verbs-listen", "want IP:PORT or off")
			}
			if !verbs.Built {
				return nil, app.Invalid("verbs-listen", "%v", verbs.ErrNotBuilt)
			}
		}
		c.shmSocket = app.String("shm-socket")
		c.shmDefault = c.shmSocket == ""
		if c.shmSocket == "" {
			c.shmSocket = filepath.Join(runtimeDir, shmSocketName)
		}
		if c.tcpListen == "off" && c.shmSocket == "off" {
			return nil, app.Invalid("tcp-listen", "tcp and shm are both off: no data plane")
		}
	}
	return c, nil
}

func sizeOf(app *cli.App, key string) (uint64, error) {
	s, err := app.Size(key)
	return uint64(s), err
}

func positive(app *cli.App, key string) (time.Duration, error) {
	d, err := app.Duration(key)
	if err == nil && d == 0 {
		err = app.Invalid(key, "must be positive")
	}
	return d, err
}

// capacityOf reads --capacity: a size or a percentage of RAM, rounded down
// to whole slabs.
func capacityOf(app *cli.App, slab uint64) (uint64, error) {
	v := strings.TrimSpace(app.String("capacity"))
	var capacity uint64
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if err != nil || p <= 0 || p > 90 {
			return 0, app.Invalid("capacity", "a percentage must be above 0 and at most 90")
		}
		mi, err := memserver.ReadMemInfo()
		if err != nil {
			return 0, app.Invalid("capacity", "%v", err)
		}
		capacity = uint64(float64(mi.Total) * p / 100)
	} else {
		s, err := app.Size("capacity")
		if err != nil {
			return 0, err
		}
		capacity = uint64(s)
	}
	capacity -= capacity % slab
	if capacity == 0 {
		return 0, app.Invalid("capacity", "less than one slab (%s)", cli.Size(slab))
	}
	mi, err := memserver.ReadMemInfo()
	if err == nil && capacity > mi.Available {
		return 0, app.Invalid("capacity", "%s is more than the free memory (MemAvailable %s)", cli.Size(capacity), cli.Size(mi.Available))
	}
	return capacity, nil
}

// readTLS builds the TLS configs from --tls-cert/--tls-key/--tls-ca (and,
// when server, --tls-client-ca).
func readTLS(app *cli.App, server bool) (srv, cl *tls.Config, err error) {
	certFile, keyFile, caFile := app.String("tls-cert"), app.String("tls-key"), app.String("tls-ca")
	if (certFile == "") != (keyFile == "") {
		return nil, nil, app.Invalid("tls-key", "--tls-cert and --tls-key go together")
	}
	var certs []tls.Certificate
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, nil, app.Invalid("tls-cert", "%v", err)
		}
		certs = []tls.Certificate{cert}
	}
	pool := func(key, file string) (*x509.CertPool, error) {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, app.Invalid(key, "%v", err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(pem) {
			return nil, app.Invalid(key, "no PEM certificate in %s", file)
		}
		return p, nil
	}
	if caFile != "" || certs != nil {
		cl = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: certs}
		if caFile != "" {
			if cl.RootCAs, err = pool("tls-ca", caFile); err != nil {
				return nil, nil, err
			}
		}
	}
	if !server {
		return nil, cl, nil
	}
	clientCA := app.String("tls-client-ca")
	if clientCA != "" && certs == nil {
		return nil, nil, app.Invalid("tls-client-ca", "mTLS needs --tls-cert and --tls-key too")
	}
	if certs != nil {
		srv = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: certs}
		if clientCA != "" {
			if srv.ClientCAs, err = pool("tls-client-ca", clientCA); err != nil {
				return nil, nil, err
			}
			srv.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return srv, cl, nil
}

// writeToken creates the token file (0600) atomically; its directory is
// created 0755 (the shm socket lives there too).
func writeToken(path string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
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

func serve(ctx context.Context, log *zap.Logger, cfg *serveConfig) (err error) {
	if cfg.generateToken {
		if cfg.token, err = writeToken(cfg.tokenFile); err != nil {
			return err
		}
		log.Info("control API token written", zap.String("file", cfg.tokenFile))
	}
	// Listen first: the memory server registers the actual address (an
	// ephemeral port in tests).
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	defer ln.Close()
	if cfg.advertiseURL == "" {
		cfg.advertiseURL = cfg.scheme + "://" + ln.Addr().String()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	api := http.NewServeMux()
	api.HandleFunc("/", httpapi.NotFound)
	roles := []string{}

	var ms *memserver.Server
	if cfg.serverRole {
		listen := map[string]string{}
		optional := map[string]bool{}
		if cfg.tcpListen != "off" {
			listen["tcp"] = cfg.tcpListen
		}
		if cfg.verbsListen != "off" {
			listen["verbs"] = cfg.verbsListen
		}
		if cfg.shmSocket != "off" {
			if err := os.MkdirAll(filepath.Dir(cfg.shmSocket), 0o755); err != nil {
				return fmt.Errorf("shm socket directory: %w", err)
			}
			listen["shm"] = cfg.shmSocket
			optional["shm"] = cfg.shmDefault
		}
		ms, err = memserver.New(memserver.Options{
			ID: pool.ServerID(cfg.id), Capacity: cfg.capacity, SlabSize: cfg.slabSize,
			Listen: listen, Optional: optional, Advertise: map[string]string{"tcp": cfg.tcpAdv},
			ControlURL: cfg.advertiseURL, Domain: cfg.domain, NoLock: !cfg.mlock, Log: log.Named("memserver"),
		})
		if err != nil {
			return err
		}
		defer ms.Close()
		if err := ms.RegisterMetrics(reg); err != nil {
			return err
		}
		ms.Routes(api)
		roles = append(roles, "server")
	}

	var co *coord.Coordinator
	if cfg.coordRole {
		st, err := store.OpenBolt(cfg.dataDir)
		if err != nil {
			return err
		}
		defer st.Close()
		dialOpts := client.Options{Token: cfg.token, TLS: cfg.clientTLS, Timeout: 10 * time.Second}
		dialer := coord.DialerFunc(func(info *pool.ServerInfo) (coord.SlabServer, error) {
			if ms != nil && info.ID == pool.ServerID(cfg.id) && info.Instance == ms.Instance() {
				return ms, nil
			}
			if info.ControlURL == "" {
				return nil, fmt.Errorf("server %s registered no control URL", info.ID)
			}
			return client.NewMemServer(info.ControlURL, dialOpts)
		})
		co, err = coord.New(coord.Options{Store: st, Dialer: dialer, SlabSize: cfg.slabSize,
			HeartbeatTimeout: cfg.hbTimeout, Log: log.Named("coord"), Registry: reg})
		if err != nil {
			return err
		}
		defer co.Close()
		if err := co.Routes(api); err != nil {
			return err
		}
		roles = append(roles, "coordinator")
	}

	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "roles": roles})
	})
	root.Handle("/", httpapi.Auth(cfg.token, cfg.mtls, api))
	hs := &http.Server{Handler: root, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, TLSConfig: cfg.serverTLS,
		ErrorLog: zap.NewStdLog(log.Named("http"))}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sweepDone, joinDone chan struct{}
	if co != nil {
		sweepDone = make(chan struct{})
		go func() { defer close(sweepDone); co.RoutineSweep(runCtx, cfg.sweep) }()
	}
	if ms != nil {
		var regr memserver.Registrar
		if co != nil {
			regr = localRegistrar{co}
		} else {
			cl, err := client.New(cfg.coordinator, client.Options{Token: cfg.token, TLS: cfg.clientTLS, Timeout: 10 * time.Second})
			if err != nil {
				cancel()
				return err
			}
			defer cl.CloseIdleConnections()
			regr = cl
		}
		joinDone = make(chan struct{})
		ready := make(chan struct{})
		go func() { defer close(joinDone); ms.RoutineJoin(runCtx, regr, cfg.hbInterval, ready) }()
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
		if cfg.serverTLS != nil {
			httpDone <- hs.ServeTLS(ln, "", "")
		} else {
			httpDone <- hs.Serve(ln)
		}
	}()
	log.Info("control API listening", zap.String("addr", ln.Addr().String()), zap.Strings("roles", roles))

	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-httpDone:
		err = fmt.Errorf("control API: %w", err)
	}
	cancel()
	if joinDone != nil {
		<-joinDone // leaves the pool while the coordinator still runs
	}
	if sweepDone != nil {
		<-sweepDone
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	return err
}
