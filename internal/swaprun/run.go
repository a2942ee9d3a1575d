package swaprun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"rmem/internal/cgroup"
	"rmem/internal/swapdev"
	"rmem/swapfs"
)

// ErrOptions: invalid Options (the error names the field).
var ErrOptions = errors.New("swaprun: invalid options")

// Options configure Run.
type Options struct {
	Command  []string // CMD and its arguments; required
	LocalMem uint64   // limit of CMD's cgroup in bytes; required

	// For setting up a pool swap file when none is active:
	Memagent  string   // the memagent binary (default: this executable)
	MountArgs []string // extra flags of `memagent mount` (pool address, token, --replicas)
	SwapSize  uint64   // size of the swap file (default 4 GiB)
	Dir       string   // mount point (default: a new directory under /run/rmem)
	Priority  int      // swapon priority (default 32767, ahead of other swap)
	// Setup forces setting up a pool swap file even if one is active.
	Setup bool

	Group string // cgroup name (default rmem-run-PID)

	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Log            *zap.Logger
}

// Validate checks the options, naming the bad field.
func (o *Options) Validate() error {
	switch {
	case len(o.Command) == 0 || o.Command[0] == "":
		return fmt.Errorf("%w: Command is required", ErrOptions)
	case o.LocalMem < 1<<20:
		return fmt.Errorf("%w: LocalMem %d: want at least 1 MiB", ErrOptions, o.LocalMem)
	case o.SwapSize%swapfs.BlockSize != 0:
		return fmt.Errorf("%w: SwapSize %d is not a multiple of %d", ErrOptions, o.SwapSize, swapfs.BlockSize)
	case o.Priority < 0 || o.Priority > 32767:
		return fmt.Errorf("%w: Priority %d: want 0..32767", ErrOptions, o.Priority)
	}
	return nil
}

func (o *Options) defaults() error {
	if o.Memagent == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("swaprun: %w", err)
		}
		o.Memagent = exe
	}
	if o.SwapSize == 0 {
		o.SwapSize = 4 << 30
	}
	if o.Priority == 0 {
		o.Priority = 32767
	}
	if o.Group == "" {
		o.Group = "rmem-run-" + strconv.Itoa(os.Getpid())
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return nil
}

// forwarded are the signals passed on to CMD.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Run runs opts.Command in a memory cgroup limited to opts.LocalMem, with a
// pool swap file active, and returns its exit code. err is set when Run
// could not run it (setup) or could not tear down; the exit code is then
// -1 if the command did not run. If ctx ends first, the command is
// killed.
func Run(ctx context.Context, opts Options) (exitCode int, err error) {
	if err := opts.Validate(); err != nil {
		return -1, err
	}
	if err := opts.defaults(); err != nil {
		return -1, err
	}
	log := opts.Log
	// From now on the forwarded signals are caught: one that arrives during
	// setup is passed to CMD as soon as it starts (it then ends at once and
	// everything is torn down), instead of killing this process and
	// leaving the swap file behind.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	active, err := ActivePoolSwaps()
	if err != nil {
		return -1, err
	}
	if len(active) > 0 && !opts.Setup {
		log.Info("using active pool swap", zap.Strings("files", active))
	} else {
		sw, err := startSwap(ctx, &opts)
		if err != nil {
			return -1, err
		}
		defer func() {
			if e := sw.stop(); e != nil && err == nil {
				err = e
			}
		}()
	}

	g, err := cgroup.Create(opts.Group, opts.LocalMem)
	if err != nil {
		return -1, err
	}
	log.Info("cgroup created", zap.String("path", g.Path), zap.Int("version", int(g.Version)), zap.Uint64("limit", opts.LocalMem))
	defer func() {
		if e := g.Remove(10 * time.Second); e != nil && err == nil {
			err = e
		}
	}()

	cmd := g.Command(opts.Command[0], opts.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("swaprun: start %s: %w", opts.Command[0], err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
			continue
		case <-ctx.Done():
			cmd.Process.Kill()
			<-waited
			return -1, ctx.Err()
		case err := <-waited:
			return exitStatus(cmd, err)
		}
	}
}

// exitStatus turns the end of cmd into a shell-style exit code.
func exitStatus(cmd *exec.Cmd, err error) (int, error) {
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return -1, fmt.Errorf("swaprun: wait: %w", err)
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}

// swap is a pool swap file set up by Run: the mount daemon and its loop
// device.
type swap struct {
	dir, made string // made: a directory Run created
	daemon    *exec.Cmd
	exited    chan error
	log       *zap.Logger
}

func startSwap(ctx context.Context, o *Options) (sw *swap, err error) {
	sw = &swap{dir: o.Dir, log: o.Log, exited: make(chan error, 1)}
	if sw.dir == "" {
		if err := os.MkdirAll("/run/rmem", 0o755); err != nil {
			return nil, fmt.Errorf("swaprun: %w", err)
		}
		if sw.dir, err = os.MkdirTemp("/run/rmem", "swap-"); err != nil {
			return nil, fmt.Errorf("swaprun: %w", err)
		}
		sw.made = sw.dir
	}
	args := append([]string{"mount", sw.dir, "--size", strconv.FormatUint(o.SwapSize, 10)}, o.MountArgs...)
	sw.daemon = exec.Command(o.Memagent, args...)
	sw.daemon.Stdout, sw.daemon.Stderr = o.Stderr, o.Stderr
	// Its own process group: a ^C at the terminal goes to CMD (forwarded)
	// but must not kill the daemon under active swap.
	sw.daemon.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sw.daemon.Start(); err != nil {
		sw.removeDir()
		return nil, fmt.Errorf("swaprun: start %s mount: %w", o.Memagent, err)
	}
	go func() { sw.exited <- sw.daemon.Wait() }()
	defer func() {
		if err != nil {
			sw.stop()
		}
	}()
	o.Log.Info("mount daemon started", zap.Int("pid", sw.daemon.Process.Pid), zap.String("dir", sw.dir))
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := SwapMounted(sw.dir)
		if err != nil {
			return sw, err
		}
		if ok {
			break
		}
		select {
		case err := <-sw.exited:
			sw.exited <- err
			return sw, fmt.Errorf("swaprun: `%s %v` exited before mounting: %v", o.Memagent, args, err)
		case <-ctx.Done():
			return sw, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return sw, fmt.Errorf("swaprun: %s not mounted after 30s", sw.dir)
		}
	}
	dev, err := swapdev.On(ctx, filepath.Join(sw.dir, swapfs.SwapName), o.Priority)
	if err != nil {
		return sw, err
	}
	o.Log.Info("pool swap on", zap.String("file", filepath.Join(sw.dir, swapfs.SwapName)), zap.String("device", dev))
	return sw, nil
}

// stop turns the swap off, stops the daemon (which unmounts) and removes
// the directory Run made.
func (sw *swap) stop() error {
	var errs []error
	file := filepath.Join(sw.dir, swapfs.SwapName)
	if err := swapdev.Off(context.Background(), file); err != nil && !errors.Is(err, swapdev.ErrNotSwap) {
		errs = append(errs, err)
	}
	sw.daemon.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-sw.exited:
		if err != nil {
			errs = append(errs, fmt.Errorf("swaprun: mount daemon: %w", err))
		}
	case <-time.After(30 * time.Second):
		sw.daemon.Process.Kill()
		<-sw.exited
		errs = append(errs, fmt.Errorf("swaprun: mount daemon did not stop within 30s"))
	}
	sw.removeDir()
	return errors.Join(errs...)
}

func (sw *swap) removeDir() {
	if sw.made != "" {
		os.Remove(sw.made)
	}
}
