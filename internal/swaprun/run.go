package swaprun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/internal/cgroup"
	"rmem/internal/childproc"
	"rmem/internal/swapdev"
	"rmem/procinfo"
	"rmem/swapfs"
)

// ErrOptions: invalid Options (the error names the field).
var ErrOptions = errors.New("swaprun: invalid options")

// GroupPrefix begins the name of each run's memory cgroup (rmem-run-PID):
// the clean-up finds a dead run's cgroup by it, and `memagent mount`
// (internal/swapd) refuses to serve from inside one.
const GroupPrefix = "rmem-run-"

// Options configure Run.
type Options struct {
	Command  []string // CMD and its arguments; required
	LocalMem uint64   // limit of CMD's cgroup in bytes; required

	// For setting up a pool swap file when none is active:
	Memagent  string   // the memagent binary (default: this executable)
	MountArgs []string // extra flags of `memagent mount` (pool address, token, --replicas)
	SwapSize  uint64   // size of the swap file (default 4 GiB)
	Dir       string   // mount point (default: a new directory under RuntimeDir)
	Priority  int      // swapon priority (default 32767, ahead of other swap)
	// Setup forces setting up a pool swap file even if one is active.
	Setup bool

	Group string // cgroup name (default GroupPrefix + PID)
	// OOMGrace is how long CMD may wait at its limit with none of its
	// pages moving before the OOM killer may act (cgroup v1; default 20s,
	// negative: the kernel's default, killing at once).
	OOMGrace time.Duration
	// RuntimeDir holds the state shared by the runs on this host (default
	// /run/rmem).
	RuntimeDir string

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
	if o.OOMGrace == 0 {
		o.OOMGrace = 20 * time.Second
	}
	if o.RuntimeDir == "" {
		o.RuntimeDir = "/run/rmem"
	}
	if o.Group == "" {
		o.Group = GroupPrefix + strconv.Itoa(os.Getpid())
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

// Run runs opts.Command in a memory cgroup limited to opts.LocalMem, with a
// pool swap file active, and returns its exit code: the status it exited
// with, or 128+N when signal N ended it (then Run also says so on
// opts.Stderr, and whether the OOM killer did it). err is set when Run
// could not run the command (the exit code is then -1) or could not tear
// everything down afterwards: the exit code is then still the command's,
// and the caller should report err and exit with it. If ctx ends first,
// the command is killed.
//
// If the mount daemon Run started dies while the command runs, Run says
// so on opts.Stderr at once and turns the group's OOM killer back on
// (nothing will be written out any more); the command's pages in swap are
// lost and its next swap-in fails with an I/O error, for which the kernel
// kills it with SIGBUS. Teardown then removes the dead mount too.
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
	catcher := childproc.Catch()
	defer catcher.Stop()
	_, root, err := cgroup.Detect()
	if err != nil {
		return -1, err
	}
	sw, err := joinSwap(ctx, &opts, filepath.Join(root, opts.Group))
	if err != nil {
		return -1, err
	}
	defer func() {
		if e := leaveSwap(&opts, sw); e != nil {
			err = errors.Join(err, e)
		}
	}()

	g, err := cgroup.Create(opts.Group, opts.LocalMem)
	if err != nil {
		return -1, err
	}
	log.Info("cgroup created", zap.String("path", g.Path), zap.Int("version", int(g.Version)), zap.Uint64("limit", opts.LocalMem))
	defer func() {
		if e := g.Remove(10 * time.Second); e != nil {
			err = errors.Join(err, e)
		}
	}()

	// swapDead is closed when the daemon this run started dies while CMD
	// runs.
	swapDead := make(chan struct{})
	running, monitored := make(chan struct{}), make(chan struct{})
	// Before leaveSwap stops the daemon on purpose.
	defer func() { close(running); <-monitored }()
	if sw == nil {
		close(monitored)
	} else {
		go func() {
			defer close(monitored)
			select {
			case <-sw.done:
			case <-running:
				// CMD may end of the daemon's death (a swap-in failed when
				// its connection aborted) before its Wait returns: the
				// kernel marked it exiting before it closed the
				// connection, so that is the test, not a race with Wait.
				select {
				case <-sw.done:
				default:
					if !procinfo.Exiting(sw.daemon.Process.Pid) {
						return
					}
					<-sw.done
				}
			}
			fmt.Fprintf(opts.Stderr, "memagent run: the swap daemon (`memagent mount %s`, pid %d) died while the command ran (%v): "+
				"the command's pages in swap are lost, its swap-ins fail with I/O errors (SIGBUS)\n", sw.dir, sw.daemon.Process.Pid, sw.waitErr)
			close(swapDead)
		}()
	}

	// v1 reclaim does not wait for swap writeback and OOM-kills what a
	// slow swap device would serve a moment later: wait instead, within
	// OOMGrace.
	if opts.OOMGrace > 0 && g.Version == cgroup.V1 {
		if err := g.SetOOMKill(false); err != nil {
			return -1, err
		}
		wctx, stop := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() { RoutineWatchOOM(wctx, g, opts.OOMGrace, swapDead, log); close(watched) }()
		defer func() { stop(); <-watched }()
	}

	cmd := g.Command(opts.Command[0], opts.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	// If this process is killed (SIGKILL: no teardown), CMD dies with it:
	// nobody would report its status or watch its OOM, and the next run
	// must be able to take down the swap it used. Kept across the exec of
	// /bin/sh and of CMD; what CMD forks is killed with the cgroup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	code, err := catcher.Run(ctx, cmd)
	if err != nil {
		return code, fmt.Errorf("swaprun: %w", err)
	}
	reportEnd(opts.Stderr, opts.Command[0], cmd, g)
	return code, nil
}

// reportEnd says on w how cmd ended when a signal ended it, naming the
// OOM killer when it acted in g.
func reportEnd(w io.Writer, name string, cmd *exec.Cmd, g *cgroup.Group) {
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return
	}
	sig := ws.Signal()
	why := ""
	if n, err := g.OOMKills(); err == nil && n > 0 && sig == syscall.SIGKILL {
		why = " by the kernel's OOM killer"
	}
	fmt.Fprintf(w, "memagent run: %s (pid %d) was killed by signal %d (%s)%s: exit code %d\n",
		name, cmd.Process.Pid, int(sig), unix.SignalName(sig), why, 128+int(sig))
}

// joinSwap removes what dead runs left, records this run (with its
// cgroup, group), makes sure a pool swap file is active, setting one up if
// none is (or if o.Setup), and counts this run among the runs using it. It
// returns the swap file it set up, or nil. Each step is written to the
// state before the next, so that a run killed half-way leaves nothing the
// next one does not find.
func joinSwap(ctx context.Context, o *Options, group string) (sw *swap, err error) {
	sh, err := lockShared(o.RuntimeDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && sw != nil {
			sw.stop()
			sh.State.Swaps = slices.DeleteFunc(sh.State.Swaps, func(s OwnedSwap) bool { return s.Dir == sw.dir })
			sw = nil
		}
		if err != nil {
			sh.State.Runs = slices.DeleteFunc(sh.State.Runs, func(r RunEntry) bool { return r.PID == os.Getpid() })
		}
		err = errors.Join(err, sh.save())
	}()
	cleaned, rerr := sh.reap(nil, o.Log)
	if len(cleaned.Removed) > 0 {
		fmt.Fprintf(o.Stderr, "memagent run: removed what dead runs left: %s\n", strings.Join(cleaned.Removed, "; "))
	}
	if rerr != nil {
		o.Log.Warn("removing what dead runs left", zap.Error(rerr))
	}
	sh.State.Runs = append(sh.State.Runs, RunEntry{PID: os.Getpid(), Start: startOf(os.Getpid()), Group: group})
	if err := sh.write(); err != nil {
		return nil, err
	}
	active, err := ActivePoolSwaps()
	if err != nil {
		return nil, err
	}
	active = slices.DeleteFunc(active, func(file string) bool {
		if err := serving(filepath.Dir(file)); err != nil {
			o.Log.Warn("not using a pool swap file whose daemon is gone", zap.String("file", file), zap.Error(err))
			return true
		}
		return false
	})
	if len(active) > 0 && !o.Setup {
		o.Log.Info("using active pool swap", zap.Strings("files", active))
		return nil, nil
	}
	sw, err = startSwap(ctx, o, func(sw *swap) error {
		pid := sw.daemon.Process.Pid
		sh.State.Swaps = append(sh.State.Swaps, OwnedSwap{Dir: sw.dir, PID: pid, Start: startOf(pid), Made: sw.made != "", Run: os.Getpid()})
		return sh.write()
	})
	return sw, err
}

// serving returns an error if the pool swap mount at dir has no daemon
// any more: its connection is aborted and every request fails (ENOTCONN).
func serving(dir string) error {
	_, err := os.ReadFile(filepath.Join(dir, swapfs.StatsName))
	return err
}

// leaveSwap uncounts this run; the last run to leave tears down every pool
// swap file that runs set up (sw is the one this run set up, or nil), and
// what dead runs left is removed as when a run starts.
func leaveSwap(o *Options, sw *swap) error {
	sh, err := lockShared(o.RuntimeDir)
	if err != nil {
		return err
	}
	sh.State.Runs = slices.DeleteFunc(sh.State.Runs, func(r RunEntry) bool { return r.PID == os.Getpid() })
	if runs := sh.liveRuns(); len(runs) > 0 && len(sh.State.Swaps) > 0 {
		o.Log.Info("leaving the pool swap to the runs in progress", zap.Ints("runs", runs))
	}
	_, rerr := sh.reap(sw, o.Log)
	return errors.Join(rerr, sh.save())
}

// swap is a pool swap file set up by Run: the mount daemon and its loop
// device.
type swap struct {
	dir, made string // made: a directory Run created
	daemon    *exec.Cmd
	done      chan struct{} // closed when the daemon has exited
	waitErr   error         // the daemon's Wait result; set before done is closed
	log       *zap.Logger
}

// startSwap starts a mount daemon, calls started as soon as its process
// runs, waits for its mount and turns its swap file on.
func startSwap(ctx context.Context, o *Options, started func(*swap) error) (sw *swap, err error) {
	sw = &swap{dir: o.Dir, log: o.Log, done: make(chan struct{})}
	if sw.dir == "" {
		if sw.dir, err = os.MkdirTemp(o.RuntimeDir, "swap-"); err != nil {
			return nil, fmt.Errorf("swaprun: %w", err)
		}
		sw.made = sw.dir
	} else if _, serr := os.Stat(sw.dir); errors.Is(serr, fs.ErrNotExist) {
		// --swap-dir names a directory to be: make it (and take it away
		// after), as the default one is.
		if err := os.Mkdir(sw.dir, 0o700); err != nil {
			return nil, fmt.Errorf("swaprun: swap dir: %w", err)
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
	go func() { sw.waitErr = sw.daemon.Wait(); close(sw.done) }()
	if err := started(sw); err != nil {
		return sw, err
	}
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
		case <-sw.done:
			return sw, fmt.Errorf("swaprun: `%s %v` exited before mounting: %v", o.Memagent, args, sw.waitErr)
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
// the directory Run made. A daemon that died earlier is no error of stop
// (Run reported it when it happened): stop then unmounts its dead mount.
func (sw *swap) stop() error {
	var errs []error
	file := filepath.Join(sw.dir, swapfs.SwapName)
	if err := swapdev.Off(context.Background(), file); err != nil && !errors.Is(err, swapdev.ErrNotSwap) {
		errs = append(errs, err)
	}
	select {
	case <-sw.done:
		sw.log.Info("the mount daemon had already exited", zap.Int("pid", sw.daemon.Process.Pid), zap.Error(sw.waitErr))
	default:
		sw.daemon.Process.Signal(syscall.SIGTERM)
		select {
		case <-sw.done:
			if sw.waitErr != nil {
				errs = append(errs, fmt.Errorf("swaprun: mount daemon after SIGTERM: %w", sw.waitErr))
			}
		case <-time.After(30 * time.Second):
			sw.daemon.Process.Kill()
			<-sw.done
			errs = append(errs, fmt.Errorf("swaprun: mount daemon did not stop within 30s"))
		}
	}
	// A daemon that died (or was killed above) leaves its mount behind,
	// its connection aborted.
	if err := unmountDead(sw.dir, sw.log); err != nil {
		errs = append(errs, err)
	}
	sw.removeDir()
	return errors.Join(errs...)
}

// unmountDead unmounts dir if it is still a pool swap mount; its daemon
// is gone.
func unmountDead(dir string, log *zap.Logger) error {
	ok, err := SwapMounted(dir)
	if err != nil || !ok {
		return err
	}
	if err := unix.Unmount(dir, 0); err != nil {
		return fmt.Errorf("swaprun: umount %s: %w", dir, err)
	}
	log.Info("unmounted the dead daemon's mount", zap.String("dir", dir))
	return nil
}

func (sw *swap) removeDir() {
	if sw.made != "" {
		os.Remove(sw.made)
	}
}
