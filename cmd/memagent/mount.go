package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/internal/agentd"
	"rmem/internal/cgroup"
	"rmem/internal/cli"
	"rmem/internal/swapdev"
	"rmem/pager/poolstore"
	"rmem/pool/client"
	"rmem/swapfs"
)

// poolFlags declares the flags that reach the pool.
func poolFlags(f *pflag.FlagSet) {
	f.String("coordinator", client.DefaultURL, "coordinator URL")
	f.String("token", "", "bearer token of the control API; default: read from --token-file")
	f.String("token-file", "/run/rmem/token", "file holding the token")
	f.Int("replicas", 0, "replicas of each slab, on distinct memory servers (0: 2 when the pool has two servers or more, else 1)")
}

// swapPoolArgs returns the pool flags as given, to pass them on to a
// `memagent mount` child.
func swapPoolArgs(app *cli.App) []string {
	var args []string
	for _, k := range []string{"coordinator", "token", "token-file", "replicas"} {
		if app.IsSet(k) {
			args = append(args, "--"+k+"="+app.String(k))
		}
	}
	return args
}

func swapPoolClient(app *cli.App) (*client.Client, error) {
	tok := strings.TrimSpace(app.String("token"))
	if tok == "" {
		t, err := client.LoadToken(app.String("token-file"))
		if err != nil {
			return nil, fmt.Errorf("no control API token: pass --token or MEMAGENT_TOKEN, or --token-file: %w", err)
		}
		tok = t
	}
	c, err := client.New(app.String("coordinator"), client.Options{Token: tok, Timeout: 10 * time.Second})
	if err != nil {
		return nil, app.Invalid("coordinator", "%v", err)
	}
	return c, nil
}

func newMountCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mount DIR",
		Short: "Serve a swap file backed by pool memory at DIR/swap (foreground FUSE daemon)",
		Long: `mount mounts a FUSE filesystem on DIR holding DIR/swap, a file of --size bytes
whose 4 KiB blocks live in pool slabs (replicated --replicas times, with
failover), and DIR/stats, its counters as JSON. Never-written blocks read as
zeros without network traffic; all I/O is direct (no page cache).

It runs in the foreground, mlockall'ed, until DIR is unmounted or it gets
SIGTERM/SIGINT; then it unmounts, unless DIR/swap is attached to a loop
device (active swap): it refuses, logs why and keeps serving. Use
'memagent swapon DIR/swap' to swap to it. Needs root.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMount(app, args[0])
		},
	}
	f := cmd.Flags()
	f.String("size", "4GiB", "size of the swap file (a multiple of 4KiB)")
	f.Int("workers", 4, "concurrent transfers to the pool")
	f.Bool("mlock", true, "mlockall the daemon (it must not be swapped out itself)")
	f.String("metrics-listen", "", "serve Prometheus /metrics on this address (e.g. 127.0.0.1:7480); off if empty")
	poolFlags(f)
	return cmd
}

func runMount(app *cli.App, dir string) error {
	log := app.Log()
	size, err := app.Size("size")
	if err != nil {
		return err
	}
	if size == 0 || uint64(size)%swapfs.BlockSize != 0 {
		return app.Invalid("size", "must be a positive multiple of 4KiB")
	}
	workers, err := app.Int("workers", 1, 256)
	if err != nil {
		return err
	}
	replicas, err := app.Int("replicas", 0, 8)
	if err != nil {
		return err
	}
	lock, err := app.Bool("mlock")
	if err != nil {
		return err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	if cg, err := cgroup.Self(); err == nil && strings.HasPrefix(filepath.Base(cg), "rmem-run-") {
		return fmt.Errorf("memagent mount is inside the memory cgroup %s of a swap-mode run: it must run outside it (reclaim of its own memory would wait on its own swap writes)", cg)
	}
	if lock {
		// First: every page of the daemon, now and later, stays resident,
		// so reclaim never waits on the daemon's own swap I/O.
		if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
			return fmt.Errorf("mlockall: %w (run as root, or pass --mlock=false)", err)
		}
	}
	pc, err := swapPoolClient(app)
	if err != nil {
		return err
	}
	defer pc.CloseIdleConnections()
	host, _ := os.Hostname()
	ctx := context.Background()
	if replicas == 0 {
		st, err := pc.Status(ctx)
		if err != nil {
			return fmt.Errorf("%w (is memd running? see --coordinator): %w", agentd.ErrNoCoordinator, err)
		}
		replicas = agentd.ChooseReplicas(st.ServersUp, 0, log)
	}
	store, err := poolstore.Open(ctx, poolstore.Options{
		Pool: pc, Agent: "memagent-swap@" + host, Node: host, PID: os.Getpid(),
		Replicas: replicas, Log: log.Named("poolstore"),
	})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := store.Close(cctx); err != nil {
			log.Warn("ending the lease", zap.Error(err))
		}
	}()
	fs, err := swapfs.New(swapfs.Options{Size: uint64(size), Store: store, Workers: workers, Log: log.Named("swapfs")})
	if err != nil {
		return err
	}
	defer fs.Close()
	if addr := app.String("metrics-listen"); addr != "" {
		stop, err := swapServeMetrics(addr, fs)
		if err != nil {
			return app.Invalid("metrics-listen", "%v", err)
		}
		defer stop()
	}
	srv, err := swapfs.Mount(dir, fs)
	if err != nil {
		return err
	}
	log.Info("serving pool swap file", zap.String("file", filepath.Join(dir, swapfs.SwapName)),
		zap.Uint64("size", uint64(size)), zap.Int("replicas", replicas), zap.String("lease", string(store.Lease().ID)))

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	for {
		select {
		case <-served:
			st := fs.Stats()
			log.Info("unmounted", zap.String("dir", dir), zap.Uint64("pool_write_bytes", st.PoolWriteBytes),
				zap.Uint64("pool_read_bytes", st.PoolReadBytes))
			return nil
		case s := <-sigs:
			if err := swapUnmountable(dir); err != nil {
				log.Warn("refusing to unmount, still serving", zap.Stringer("signal", s), zap.Error(err))
				continue
			}
			log.Info("unmounting", zap.Stringer("signal", s), zap.String("dir", dir))
			if err := srv.Unmount(); err != nil {
				log.Warn("unmount failed, still serving", zap.Error(err))
			}
		}
	}
}

// swapServeMetrics serves the file system's counters for Prometheus on
// addr until stop is called.
func swapServeMetrics(addr string, fs *swapfs.FS) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(fs.Collector())
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { hs.Serve(ln); close(done) }()
	return func() { hs.Close(); <-done }, nil
}

// swapUnmountable returns an error saying why DIR must stay mounted: its
// swap file is attached to a loop device (and maybe active swap).
func swapUnmountable(dir string) error {
	file := filepath.Join(dir, swapfs.SwapName)
	loops, swap, err := swapdev.InUse(file)
	if err != nil {
		return err
	}
	if len(loops) == 0 {
		return nil
	}
	what := "attached to " + loops[0].Device
	if swap {
		what = "active swap on " + loops[0].Device
	}
	return fmt.Errorf("%s is %s: run 'memagent swapoff %s' first", file, what, file)
}

func newUmountCmd(app *cli.App) *cobra.Command {
	return &cobra.Command{
		Use:   "umount DIR",
		Short: "Unmount a pool swap file system (refused while its swap file is in use)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if err := swapUnmountable(dir); err != nil {
				return fmt.Errorf("not unmounting %s: %w", dir, err)
			}
			if err := unix.Unmount(dir, 0); err != nil {
				return fmt.Errorf("umount %s: %w", dir, err)
			}
			return nil
		},
	}
}
