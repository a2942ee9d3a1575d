package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"rmem/internal/agentd"
	"rmem/internal/cli"
	"rmem/internal/startwait"
	"rmem/internal/swapd"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/swapfs"
)

// poolFlags declares the flags that reach the pool.
func poolFlags(f *pflag.FlagSet) {
	f.String("coordinator", client.DefaultURL, "coordinator URL")
	f.String("token", "", "bearer token of the control API; default: read from --token-file")
	f.String("token-file", "/run/rmem/token", "file holding the token")
	f.Int("replicas", 0, "replicas of each slab, on distinct memory servers (0: the pool's default, or 2 when the pool has two servers or more, else 1)")
	f.String("redundancy", "", "how pages are kept in the pool: rep:N (N copies on distinct memory servers) or ec:K+M (erasure-coded: stripes of K data and M parity pages on K+M servers, which survive M lost servers at (K+M)/K the bytes, e.g. ec:6+2); empty: --replicas, else the pool's default")
	f.String("connect-timeout", startwait.DefaultTimeout.String(), "at start, how long to wait for the coordinator to answer and for --token-file to appear (a memd starting beside us writes it); 0: fail at once")
}

// swapPoolArgs returns the pool flags as given, to pass them on to a
// `memagent mount` child.
func swapPoolArgs(app *cli.App) []string {
	var args []string
	for _, k := range []string{"coordinator", "token", "token-file", "replicas", "redundancy", "connect-timeout"} {
		if app.IsSet(k) {
			args = append(args, "--"+k+"="+app.String(k))
		}
	}
	return args
}

// swapPoolClient returns a client of the pool's coordinator once the
// coordinator answers, waiting for it, and for the token file, up to
// --connect-timeout: memd may be starting beside us.
func swapPoolClient(ctx context.Context, app *cli.App) (*client.Client, error) {
	timeout, err := app.Duration("connect-timeout")
	if err != nil {
		return nil, err
	}
	log := app.Log()
	tok := strings.TrimSpace(app.String("token"))
	if tok == "" {
		file := app.String("token-file")
		t, err := startwait.TokenFile(ctx, file, timeout, func(err error) {
			log.Info("waiting for the token file (memd writes it when it starts)", zap.String("file", file), zap.Duration("connect_timeout", timeout), zap.Error(err))
		})
		if err != nil {
			return nil, fmt.Errorf("no control API token: pass --token or MEMAGENT_TOKEN, or --token-file: %w", err)
		}
		tok = t
	}
	c, err := client.New(app.String("coordinator"), client.Options{Token: tok, Timeout: 10 * time.Second})
	if err != nil {
		return nil, app.Invalid("coordinator", "%v", err)
	}
	err = startwait.Pool(ctx, func(ctx context.Context) error {
		_, err := c.Status(ctx)
		return err
	}, timeout, func(err error) {
		log.Info("waiting for the coordinator", zap.String("coordinator", c.URL()), zap.Duration("connect_timeout", timeout), zap.Error(err))
	})
	if err != nil {
		return nil, fmt.Errorf("%w (is memd running? see --coordinator): %w", agentd.ErrNoCoordinator, err)
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

// runMount reads mount's flags into the daemon's options and runs it
// (internal/swapd) until DIR is unmounted.
func runMount(app *cli.App, dir string) error {
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
	var red pool.Redundancy
	if v := strings.TrimSpace(app.String("redundancy")); v != "" {
		if red, err = pool.ParseRedundancy(v); err != nil {
			return app.Invalid("redundancy", "%v", err)
		}
		if app.IsSet("replicas") {
			return app.Invalid("redundancy", "give --redundancy or --replicas, not both")
		}
	}
	lock, err := app.Bool("mlock")
	if err != nil {
		return err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	pc, err := swapPoolClient(context.Background(), app)
	if err != nil {
		return err
	}
	defer pc.CloseIdleConnections()
	err = swapd.Run(context.Background(), swapd.Options{
		Dir: dir, Size: uint64(size), Workers: workers, Pool: pc, Replicas: replicas, Redundancy: red,
		MetricsListen: app.String("metrics-listen"), Lock: lock,
		StopSignals: []os.Signal{syscall.SIGTERM, syscall.SIGINT}, Log: app.Log(),
	})
	return metricsFlagErr(app, err)
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
			return swapd.Unmount(dir)
		},
	}
}
