package swapd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/internal/agentd"
	"rmem/internal/cgroup"
	"rmem/internal/metricsrv"
	"rmem/internal/swapdev"
	"rmem/internal/swaprun"
	"rmem/pager/poolstore"
	"rmem/pool"
	"rmem/swapfs"
)

// ErrOptions is wrapped by errors about Options; they name the field.
var ErrOptions = errors.New("swapd: invalid options")

// ErrInUse is matched (errors.Is) by the error saying why a pool swap
// file system must stay mounted: its swap file backs a loop device, maybe
// active swap.
var ErrInUse = errors.New("swapd: the swap file is in use")

// Options configure the daemon. cmd/memagent has checked every value
// against its flag; Run checks them again before anything starts.
type Options struct {
	Dir     string         // the mount point, an absolute path; required
	Size    uint64         // bytes of the swap file: a positive multiple of swapfs.BlockSize
	Workers int            // concurrent transfers to the pool, up to 256 (0: swapfs's default)
	Pool    poolstore.Pool // the coordinator's client; required
	// Replicas of each slab, on distinct memory servers; 0: 2 when the
	// pool has two servers up or more, else 1 (agentd.ChooseReplicas).
	Replicas int
	// Redundancy, when set, is how blocks are kept instead (rep:N or
	// ec:K+M, agentd.ResolveRedundancy).
	Redundancy pool.Redundancy
	// MetricsListen is where to serve the file system's counters for
	// Prometheus, HOST:PORT ("": nowhere). Failing to listen there is a
	// *MetricsError.
	MetricsListen string
	// Lock mlockall's the process before anything else; its failure is
	// fatal (a daemon paged by its own swap can deadlock).
	Lock bool
	// StopSignals ask the daemon to unmount, each time one arrives
	// (memagent mount: SIGTERM and SIGINT). Run catches them from the
	// moment it serves; until then they keep their usual effect (a ^C
	// during a start that hangs on the pool ends the process).
	StopSignals []os.Signal
	Log         *zap.Logger
}

func (o *Options) validate() error {
	switch {
	case !filepath.IsAbs(o.Dir):
		return fmt.Errorf("%w: Dir %q: want an absolute path", ErrOptions, o.Dir)
	case o.Size == 0 || o.Size%swapfs.BlockSize != 0:
		return fmt.Errorf("%w: Size %d: want a positive multiple of %d", ErrOptions, o.Size, swapfs.BlockSize)
	case o.Workers < 0 || o.Workers > 256:
		return fmt.Errorf("%w: Workers %d: want 0..256", ErrOptions, o.Workers)
	case o.Pool == nil:
		return fmt.Errorf("%w: Pool is required", ErrOptions)
	case o.Replicas < 0:
		return fmt.Errorf("%w: Replicas %d is negative", ErrOptions, o.Replicas)
	}
	return nil
}

// Run runs the daemon (see the package comment) until DIR is unmounted,
// and returns nil then. Each of Options.StopSignals, and the end of ctx,
// asks it to unmount; the request is refused while the swap file is in
// use. Whatever Run started is stopped when it returns.
func Run(ctx context.Context, opts Options) error {
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	if err := opts.validate(); err != nil {
		return err
	}
	if cg, err := cgroup.Self(); err == nil && strings.HasPrefix(filepath.Base(cg), swaprun.GroupPrefix) {
		return fmt.Errorf("memagent mount is inside the memory cgroup %s of a swap-mode run: it must run outside it (reclaim of its own memory would wait on its own swap writes)", cg)
	}
	if opts.Lock {
		// First: every page of the daemon, now and later, stays resident,
		// so reclaim never waits on the daemon's own swap I/O.
		if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
			return fmt.Errorf("mlockall: %w (run as root, or pass --mlock=false)", err)
		}
	}
	st, err := opts.Pool.Status(ctx)
	if err != nil {
		return fmt.Errorf("%w (is memd running? see --coordinator): %w", agentd.ErrNoCoordinator, err)
	}
	red := agentd.ResolveRedundancy(st, opts.Redundancy, opts.Replicas, log)
	host, _ := os.Hostname()
	store, err := poolstore.Open(ctx, poolstore.Options{
		Pool: opts.Pool, Agent: "memagent-swap@" + host, Node: host, PID: os.Getpid(),
		Replicas: max(1, red.Copies), Redundancy: red, Log: log.Named("poolstore"),
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
	fs, err := swapfs.New(swapfs.Options{Size: opts.Size, Store: store, Workers: opts.Workers, Log: log.Named("swapfs")})
	if err != nil {
		return err
	}
	defer fs.Close()
	if opts.MetricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(fs.Collector())
		_, stopMetrics, err := metricsrv.Serve(opts.MetricsListen, reg)
		if err != nil {
			return fmt.Errorf("swapd: %w", err) // a *metricsrv.Error
		}
		defer stopMetrics()
	}
	srv, err := swapfs.Mount(opts.Dir, fs)
	if err != nil {
		return err
	}
	stop := make(chan os.Signal, 4)
	if len(opts.StopSignals) > 0 {
		signal.Notify(stop, opts.StopSignals...)
		defer signal.Stop(stop)
	}
	log.Info("serving pool swap file", zap.String("file", filepath.Join(opts.Dir, swapfs.SwapName)),
		zap.Uint64("size", opts.Size), zap.Stringer("redundancy", red), zap.String("lease", string(store.Lease().ID)))

	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	// request unmounts unless the swap file is in use; why says who asked.
	request := func(why zap.Field) {
		if err := inUse(opts.Dir); err != nil {
			log.Warn("refusing to unmount, still serving", why, zap.Error(err))
			return
		}
		log.Info("unmounting", why, zap.String("dir", opts.Dir))
		if err := srv.Unmount(); err != nil {
			log.Warn("unmount failed, still serving", zap.Error(err))
		}
	}
	ctxDone := ctx.Done()
	for {
		select {
		case <-served:
			st := fs.Stats()
			log.Info("unmounted", zap.String("dir", opts.Dir), zap.Uint64("pool_write_bytes", st.PoolWriteBytes),
				zap.Uint64("pool_read_bytes", st.PoolReadBytes))
			return nil
		case s := <-stop:
			request(zap.Stringer("signal", s))
		case <-ctxDone:
			ctxDone = nil // one request: a context ends once
			request(zap.NamedError("context", ctx.Err()))
		}
	}
}

// Unmount unmounts the pool swap file system at dir (served by another
// process), unless its swap file is in use: the error then matches
// ErrInUse and says why.
func Unmount(dir string) error {
	if err := inUse(dir); err != nil {
		return fmt.Errorf("not unmounting %s: %w", dir, err)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		return fmt.Errorf("umount %s: %w", dir, err)
	}
	return nil
}

// inUse returns an error saying why dir must stay mounted: its swap file
// is attached to a loop device (and maybe active swap). That error matches
// ErrInUse; one reading the loop devices does not.
func inUse(dir string) error {
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
	return inUseError(fmt.Sprintf("%s is %s: run 'memagent swapoff %s' first", file, what, file))
}

// inUseError is said as it is (the CLI shows it) and matches ErrInUse.
type inUseError string

func (e inUseError) Error() string        { return string(e) }
func (e inUseError) Is(target error) bool { return target == ErrInUse }
