package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"rmem/internal/cli"
	"rmem/internal/memdd"
	"rmem/internal/startwait"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/memserver"
	"rmem/pool/store"
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
			opts, err := readServeConfig(app)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return memdd.Run(ctx, app.Log(), opts)
		},
	}
	f := cmd.Flags()
	f.String("role", "all", "roles to run: all (memory server + coordinator), server, or coordinator")
	f.String("listen", defaultListen, "control API address (HTTP); a non-loopback address needs a configured token or mTLS")
	f.String("advertise-url", "", "control URL the coordinator uses to reach this memory server (default http(s)://<listen>)")
	f.String("coordinator", "", "coordinator URL, or the coordinators' URLs comma-separated, for --role server (env MEMD_COORDINATOR); with --store etcd, other coordinators to find the leader through")
	f.String("id", "", "this memory server's id in the pool (default: the host name)")
	f.String("capacity", "1GiB", "memory to donate: a size (4GiB) or a percentage of RAM (25%)")
	f.String("slab-size", "64MiB", "slab size, the unit of allocation (a multiple of 2MiB; the same on every node)")
	f.String("failure-domain", "", "failure domain (rack, zone) of this server: replicas of a slab avoid sharing one")
	f.String("tcp-listen", defaultTCPListen, "data-plane tcp address (\"off\" disables)")
	f.String("tcp-advertise", "", "tcp address registered for agents (default: the listener's address)")
	f.String("spin", "50us", cli.SpinFlag)
	f.String("shm-socket", "", "data-plane shm socket (default <runtime-dir>/memd-data.sock; \"off\" disables)")
	f.String("verbs-listen", "off", "data-plane RDMA verbs set-up address IP:PORT on an RDMA device's IP (needs a memd built with -tags verbs; docs/rdma-hardware.md)")
	f.String("data-dir", defaultDataDir, "coordinator metadata directory (bbolt file memd.db), with --store bbolt")
	f.String("store", "bbolt", "coordinator metadata store: bbolt (a file in --data-dir, one coordinator) or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (several coordinators, one elected leader; docs/ha.md)")
	f.String("election-ttl", "5s", "coordinator on etcd: TTL of its etcd lease, whole seconds; a dead leader is replaced about this long after it stopped")
	f.Int("etcd-max-txn-ops", 128, "coordinator on etcd: the etcd servers' --max-txn-ops (the largest transaction they take)")
	f.String("heartbeat-interval", "2s", "memory server heartbeat interval")
	f.String("connect-timeout", startwait.DefaultTimeout.String(), "--role server: at start, how long to wait for --token-file to appear (the coordinator writes it) and for the coordinator to take the registration before failing; 0: wait for the token file not at all, for the coordinator for ever")
	f.String("heartbeat-timeout", "10s", "coordinator: a server silent this long is dead")
	f.String("redundancy", "", "coordinator: the pool's default for agents that choose none: rep:N, or ec:K+M (erasure-coded over K+M servers in distinct failure domains; agents keep copies while the pool has fewer); empty: the agents' own (ec:6+2 where the servers up span eight failure domains, else two copies with two servers or more)")
	f.String("sweep-interval", "1s", "coordinator: how often to look for dead servers and expired leases")
	f.String("mlock", "true", "lock donated memory in RAM (needs RLIMIT_MEMLOCK ≥ capacity, or root)")
	f.String("tls-client-ca", "", "require client certificates signed by this CA (mTLS) on the control API")
	addCommonFlags(f)
	return cmd
}

// minNetworkToken is the shortest token a control API on a non-loopback
// address accepts (16 bytes: 128 bits when random).
const minNetworkToken = 16

// checkTokenFileMode refuses a token file that its group or others may
// read or write.
func checkTokenFileMode(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return fmt.Errorf("token file %s has mode %04o: group or others may read it (the token administers the pool); chmod 600 %s", path, m, path)
	}
	return nil
}

// readServeConfig reads and validates every serve option before anything
// starts, into the daemon's options.
func readServeConfig(app *cli.App) (memdd.Options, error) {
	var o memdd.Options
	role, err := app.OneOf("role", "all", "server", "coordinator")
	if err != nil {
		return o, err
	}
	if role != "server" {
		o.Coord = &memdd.CoordOptions{}
	}
	if role != "coordinator" {
		o.Server = &memdd.ServerOptions{}
	}
	o.Listen = app.String("listen")
	if _, port, err := net.SplitHostPort(o.Listen); err != nil || port == "" {
		return o, app.Invalid("listen", "want HOST:PORT")
	}
	if o.SlabSize, err = sizeOf(app, "slab-size"); err != nil {
		return o, err
	}
	if o.SlabSize == 0 || o.SlabSize%(2<<20) != 0 {
		return o, app.Invalid("slab-size", "must be a positive multiple of 2MiB")
	}
	// Every role's values are checked, whichever roles run.
	heartbeatInterval, err := positive(app, "heartbeat-interval")
	if err != nil {
		return o, err
	}
	heartbeatTimeout, err := positive(app, "heartbeat-timeout")
	if err != nil {
		return o, err
	}
	if o.Coord != nil && o.Server != nil && heartbeatTimeout <= heartbeatInterval {
		return o, app.Invalid("heartbeat-timeout", "must be longer than heartbeat-interval (%s)", heartbeatInterval)
	}
	sweepInterval, err := positive(app, "sweep-interval")
	if err != nil {
		return o, err
	}
	mlock, err := app.Bool("mlock")
	if err != nil {
		return o, err
	}
	runtimeDir := app.String("runtime-dir")
	if !filepath.IsAbs(runtimeDir) {
		return o, app.Invalid("runtime-dir", "must be an absolute path")
	}
	if c := o.Coord; c != nil {
		c.HeartbeatTimeout, c.SweepInterval = heartbeatTimeout, sweepInterval
		if c.Redundancy = strings.TrimSpace(app.String("redundancy")); c.Redundancy != "" {
			if _, err := pool.ParseRedundancy(c.Redundancy); err != nil {
				return o, app.Invalid("redundancy", "%v", err)
			}
		}
		if storeURL := strings.TrimSpace(app.String("store")); storeURL != "bbolt" {
			c.Etcd = &memdd.EtcdOptions{}
			if c.Etcd.Endpoints, c.Etcd.Prefix, err = store.ParseEtcdURL(storeURL); err != nil {
				return o, app.Invalid("store", "want bbolt or etcd://HOST:PORT[,HOST:PORT...][/PREFIX]: %v", err)
			}
			if c.Etcd.ElectionTTL, err = positive(app, "election-ttl"); err != nil {
				return o, err
			}
			if c.Etcd.ElectionTTL%time.Second != 0 {
				return o, app.Invalid("election-ttl", "must be a whole number of seconds (etcd leases count in seconds)")
			}
			if c.Etcd.MaxTxnOps, err = app.Int("etcd-max-txn-ops", 1, 1<<20); err != nil {
				return o, err
			}
		} else if c.DataDir = app.String("data-dir"); !filepath.IsAbs(c.DataDir) {
			return o, app.Invalid("data-dir", "must be an absolute path")
		}
	}
	connectTimeout, err := app.Duration("connect-timeout")
	if err != nil {
		return o, err
	}
	tokenFile := app.String("token-file")
	if tokenFile == "" {
		tokenFile = filepath.Join(runtimeDir, tokenFileName)
	}
	if o.ServerTLS, o.ClientTLS, err = readTLS(app, true); err != nil {
		return o, err
	}
	mtls := o.ServerTLS != nil && o.ServerTLS.ClientAuth == tls.RequireAndVerifyClientCert

	o.Token = strings.TrimSpace(app.String("token"))
	configured := o.Token != "" || app.IsSet("token-file")
	network := !memdd.Loopback(o.Listen)
	fromFile := false
	if o.Token == "" {
		tok, err := client.LoadToken(tokenFile)
		switch {
		case err == nil:
			o.Token, fromFile = tok, true
		case errors.Is(err, os.ErrNotExist) && o.Coord != nil:
			o.NewTokenFile = tokenFile
		case errors.Is(err, os.ErrNotExist) && !mtls && app.String("coordinator") == "":
			return o, app.Invalid("coordinator", "--role server needs the coordinator's URL")
		case errors.Is(err, os.ErrNotExist) && !mtls:
			// A coordinator starting beside us writes it.
			tok, err := startwait.TokenFile(context.Background(), tokenFile, connectTimeout, func(err error) {
				app.Log().Info("waiting for the token file (the coordinator writes it when it starts)", zap.String("file", tokenFile), zap.Duration("connect_timeout", connectTimeout))
			})
			if err != nil {
				return o, app.Invalid("token", "--role server needs the coordinator's token (--token, MEMD_TOKEN, or --token-file; %s does not exist)", tokenFile)
			}
			o.Token, fromFile = tok, true
		case !errors.Is(err, os.ErrNotExist):
			return o, app.Invalid("token-file", "%v", err)
		}
	}
	if network && !configured && !mtls {
		return o, app.Invalid("listen", "listening on a non-loopback address needs a configured token (--token, MEMD_TOKEN, --token-file) or mTLS (--tls-cert, --tls-key, --tls-client-ca)")
	}
	if network && o.Token != "" {
		// Whoever reaches a network listener may guess at the token, and
		// whoever reads the token file administers the pool.
		if fromFile {
			if err := checkTokenFileMode(tokenFile); err != nil {
				return o, app.Invalid("token-file", "%v", err)
			}
		}
		if len(o.Token) < minNetworkToken {
			key, from := "token", "--token, MEMD_TOKEN or config token"
			if fromFile {
				key, from = "token-file", tokenFile
			}
			return o, app.Invalid(key, "the control API listens on %s (not loopback): its token must have at least %d bytes, the one from %s has %d (memd writes a 64-character one when it creates the token file)", o.Listen, minNetworkToken, from, len(o.Token))
		}
	}
	o.AdvertiseURL = app.String("advertise-url")
	if o.AdvertiseURL != "" {
		if u, err := url.Parse(o.AdvertiseURL); err != nil || u.Host == "" {
			return o, app.Invalid("advertise-url", "want http(s)://HOST:PORT")
		}
	}
	if o.Coord != nil && o.Coord.Etcd != nil {
		// Clients are sent to the leader at the URL it advertises.
		if host, _, _ := net.SplitHostPort(o.Listen); o.AdvertiseURL == "" && (host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified()) {
			return o, app.Invalid("advertise-url", "a coordinator on etcd listening on a wildcard address (%s) needs the URL other nodes reach it at", o.Listen)
		}
		if o.ID = app.String("id"); o.ID == "" {
			if o.ID, err = os.Hostname(); err != nil {
				return o, app.Invalid("id", "no host name to default to: %v", err)
			}
		}
		// Other coordinators, for this node's memory server to find the
		// leader through.
		if c := app.String("coordinator"); c != "" {
			if _, err := client.New(c, client.Options{}); err != nil {
				return o, app.Invalid("coordinator", "%v", err)
			}
		}
	}

	if sv := o.Server; sv != nil {
		sv.HeartbeatInterval, sv.Mlock = heartbeatInterval, mlock
		if role == "server" {
			sv.ConnectTimeout = connectTimeout
		}
		sv.CoordinatorURL = app.String("coordinator")
		if role == "server" {
			if sv.CoordinatorURL == "" {
				return o, app.Invalid("coordinator", "--role server needs the coordinator's URL")
			}
			if _, err := client.New(sv.CoordinatorURL, client.Options{}); err != nil {
				return o, app.Invalid("coordinator", "%v", err)
			}
		}
		if sv.Capacity, err = capacityOf(app, o.SlabSize); err != nil {
			return o, err
		}
		o.ID = app.String("id")
		if o.ID == "" {
			if o.ID, err = os.Hostname(); err != nil {
				return o, app.Invalid("id", "no host name to default to: %v", err)
			}
		}
		if err := (&pool.ServerInfo{ID: pool.ServerID(o.ID), Instance: "x", SlabSize: o.SlabSize, Addrs: map[string]string{"x": "x"}}).Validate(); err != nil {
			return o, app.Invalid("id", "%v", err)
		}
		sv.Domain = app.String("failure-domain")
		// "off" disables a data plane; the daemon takes "" for that.
		tcpListen := app.String("tcp-listen")
		if tcpListen != "off" {
			if _, _, err := net.SplitHostPort(tcpListen); err != nil {
				return o, app.Invalid("tcp-listen", "want HOST:PORT or off")
			}
			sv.TCPListen = tcpListen
		}
		sv.TCPAdvertise = app.String("tcp-advertise")
		if sv.Spin, err = app.Spin("spin"); err != nil {
			return o, err
		}
		if v := app.String("verbs-listen"); v != "off" {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return o, app.Invalid("verbs-listen", "want IP:PORT or off")
			}
			if !verbs.Built {
				return o, app.Invalid("verbs-listen", "%v", verbs.ErrNotBuilt)
			}
			sv.VerbsListen = v
		}
		shmSocket := app.String("shm-socket")
		sv.ShmOptional = shmSocket == "" // not asked for: run without shm if it cannot start
		if shmSocket == "" {
			shmSocket = filepath.Join(runtimeDir, shmSocketName)
		}
		if shmSocket != "off" {
			sv.ShmSocket = shmSocket
		}
		if tcpListen == "off" && shmSocket == "off" {
			return o, app.Invalid("tcp-listen", "tcp and shm are both off: no data plane")
		}
	}
	return o, nil
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
