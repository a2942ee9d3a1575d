package main

import (
	"context"
	"errors"

	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"rmem/internal/agentd"
	"rmem/internal/childproc"
	"rmem/internal/cli"
	"rmem/internal/metricsrv"
	"rmem/pager"
	"rmem/pager/proto"
	"rmem/pool"
	"rmem/rdma/verbs"
	"rmem/traced"
)

// agentFlags are the flags of an agent daemon, for serve and for the agent
// that run starts when none is running.
func agentFlags(f *pflag.FlagSet) {
	f.String("socket", proto.DefaultSocket, "Unix socket the programs' shim connects to")
	f.String("min-alloc", "64KiB", "a program's own anonymous mmaps from this size are paged (its malloc'd memory is, whatever the size)")
	f.String("network", "tcp", "rdma provider to reach memory servers: tcp, shm (same host) or verbs")
	f.String("lease-ttl", "30s", "TTL of the agent's lease on its slabs (renewed every third of it)")
	f.String("fault-timeout", "60s", "how long a fault waits for a pool that does not answer before its page is given up (SIGBUS); 0: forever")
	f.String("spin", "50us", cli.SpinFlag)
	f.String("metrics-listen", "", "serve the agent's Prometheus /metrics over TCP on this address (e.g. 127.0.0.1:7481) for a Prometheus server to scrape; off if empty (run: its own agent's only)")
	f.String("max-slowdown", "0", "steer each program's budget by its paging stall: at most PCT of wall time in misses (e.g. 2%); --local-mem is then a ceiling, and without it the node's RAM (docs/pager.md, Budgets from a slowdown target); 0: a fixed budget")
}

// maxSlowdown reads --max-slowdown: PCT, with or without a %, as a
// fraction (0: off).
func maxSlowdown(app *cli.App) (float64, error) {
	v := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(app.String("max-slowdown")), "%"))
	pct, err := strconv.ParseFloat(v, 64)
	if err != nil || pct < 0 || pct >= 100 || math.IsNaN(pct) {
		return 0, app.Invalid("max-slowdown", "want a percentage from 0 (off) to under 100, e.g. 2%%")
	}
	if pct > 0 && pct < 0.01 {
		return 0, app.Invalid("max-slowdown", "want at least 0.01%% (or 0: off)")
	}
	return pct / 100, nil
}

// totalRAM returns the node's RAM in bytes: the ceiling of a steered
// budget without --local-mem.
func totalRAM() uint64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 1 << 40
	}
	return si.Totalram * uint64(si.Unit)
}

// agentOptions reads the flags of agentFlags. The caller adds the pool
// client (swapPoolClient) where it starts an agent: it needs the control
// API token, which a program run by an agent already running does not.
func agentOptions(app *cli.App, localMem cli.Size) (agentd.Options, error) {
	var o agentd.Options
	minAlloc, err := app.Size("min-alloc")
	if err != nil {
		return o, err
	}
	if minAlloc < 4096 {
		return o, app.Invalid("min-alloc", "must be at least 4KiB")
	}
	network, err := app.OneOf("network", "tcp", "shm", "verbs")
	if err != nil {
		return o, err
	}
	if network == "verbs" && !verbs.Built {
		return o, app.Invalid("network", "%v", verbs.ErrNotBuilt)
	}
	ttl, err := app.Duration("lease-ttl")
	if err != nil {
		return o, err
	}
	if ttl < time.Second {
		return o, app.Invalid("lease-ttl", "must be at least 1s")
	}
	replicas, err := app.Int("replicas", 0, 8)
	if err != nil {
		return o, err
	}
	var red pool.Redundancy
	if v := strings.TrimSpace(app.String("redundancy")); v != "" {
		if red, err = pool.ParseRedundancy(v); err != nil {
			return o, app.Invalid("redundancy", "%v", err)
		}
		if app.IsSet("replicas") {
			return o, app.Invalid("redundancy", "give --redundancy or --replicas, not both")
		}
	}
	faultTimeout, err := app.Duration("fault-timeout")
	if err != nil {
		return o, err
	}
	switch {
	case faultTimeout < 0 || faultTimeout > 0 && faultTimeout < time.Second:
		return o, app.Invalid("fault-timeout", "want 0 (forever) or at least 1s")
	case faultTimeout == 0:
		faultTimeout = -1 // pager.Options: negative waits forever
	}
	spinMax, err := app.Spin("spin")
	if err != nil {
		return o, err
	}
	if localMem < 64<<10 {
		return o, app.Invalid("local-mem", "must be at least 64KiB")
	}
	slowdown, err := maxSlowdown(app)
	if err != nil {
		return o, err
	}
	if slowdown > 0 && !app.IsSet("local-mem") {
		localMem = cli.Size(totalRAM()) // everything local to start with
	}
	metrics := strings.TrimSpace(app.String("metrics-listen"))
	if _, port, err := net.SplitHostPort(metrics); metrics != "" && (err != nil || port == "") {
		return o, app.Invalid("metrics-listen", "want HOST:PORT, e.g. 127.0.0.1:7481")
	}
	return agentd.Options{MaxSlowdown: slowdown, MetricsListen: metrics,
		Socket: app.String("socket"), LocalMem: uint64(localMem), MinAlloc: uint64(minAlloc),
		Replicas: replicas, Redundancy: red, Network: network, LeaseTTL: ttl, FaultTimeout: faultTimeout, Spin: spinMax, Log: app.Log(), Lock: true,
	}, nil
}

func newServeCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the paging agent of this node",
		Long: `serve runs the agent that pages programs' memory to the pool: programs started
with the shim (memagent run, or LD_PRELOAD=librmem.so) hand it their large
allocations, and it keeps each of them under --local-mem resident, the rest
in pool slabs it leases from the coordinator. With --max-slowdown it steers
each program's budget instead: everything local to start with, cold pages out
while the program's paging stall stays under the target, memory back when it
rises; --local-mem is then a ceiling. 'memagent stats' shows what it
does. Needs root. Programs of other users are paged when --allow-user or
--allow-group lets them in; the agent lends them /dev/userfaultfd.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			localMem, err := app.Size("local-mem")
			if err != nil {
				return err
			}
			nodeMem, err := app.Size("node-mem")
			if err != nil {
				return err
			}
			if nodeMem != 0 && nodeMem < localMem && app.IsSet("local-mem") {
				return app.Invalid("node-mem", "must be 0 (no node-wide limit) or at least --local-mem (%v)", localMem)
			}
			opts, err := agentOptions(app, localMem)
			if err != nil {
				return err
			}
			if opts.Pool, err = swapPoolClient(cmd.Context(), app); err != nil {
				return err
			}
			opts.NodeMem, opts.AdminSocket = uint64(nodeMem), app.String("admin-socket")
			switch opts.StateDir = app.String("state-dir"); opts.StateDir {
			case "auto": // one per socket: agents on other sockets are other agents
				opts.StateDir = opts.Socket + ".state"
			case "none":
				opts.StateDir = ""
			}
			if opts.AllowUIDs, opts.SocketGroup, err = allowOptions(app); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			d, err := agentd.Start(ctx, opts)
			if err != nil {
				return metricsFlagErr(app, err)
			}
			select {
			case <-ctx.Done():
				app.Log().Info("stopping")
			case err := <-d.Done():
				app.Log().Error("agent stopped", zap.Error(err))
			}
			return d.Close()
		},
	}
	f := cmd.Flags()
	agentFlags(f)
	f.String("state-dir", "auto", "where the agent leaves its lease and its programs' page journal (tmpfs), so that an agent started after it (killed, restarted) resumes them without losing a page; auto: SOCKET.state; none: no restart")
	poolFlags(f)
	f.String("local-mem", "512MiB", "resident memory each program may keep")
	f.String("node-mem", "0", "resident memory all programs together may keep (0: no node-wide limit)")
	f.String("admin-socket", agentd.DefaultAdminSocket, "Unix socket serving 'memagent stats' and /metrics (root's; users the agent serves see their own programs' stats)")
	f.StringSlice("allow-user", nil, "users (names or uids) whose programs the agent pages, besides root's; they need write access to --socket too (see --allow-group)")
	f.String("allow-group", "", "group (name or gid) given the socket (mode 0660): its members' programs are paged")
	return cmd
}

// allowOptions reads --allow-user and --allow-group.
func allowOptions(app *cli.App) (uids []uint32, gid int, err error) {
	for _, name := range app.StringSlice("allow-user") {
		u, err := user.Lookup(name)
		if err != nil {
			if u, err = user.LookupId(name); err != nil {
				return nil, 0, app.Invalid("allow-user", "no user %q", name)
			}
		}
		id, _ := strconv.ParseUint(u.Uid, 10, 32)
		uids = append(uids, uint32(id))
	}
	if name := app.String("allow-group"); name != "" {
		g, err := user.LookupGroup(name)
		if err != nil {
			if g, err = user.LookupGroupId(name); err != nil {
				return nil, 0, app.Invalid("allow-group", "no group %q", name)
			}
		}
		gid, _ = strconv.Atoi(g.Gid)
		if gid == 0 {
			return nil, 0, app.Invalid("allow-group", "group %q is root's group", name)
		}
	}
	return uids, gid, nil
}

func newStatsCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show what the agent does for each program: resident and remote memory, faults, latency, evictions, prefetch",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := app.Bool("json")
			if err != nil {
				return err
			}
			all, err := app.Bool("all")
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			st, err := agentd.FetchStats(ctx, app.String("admin-socket"))
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(app.Stdout(), st)
			}
			rows := st.Clients
			if all {
				rows = append(append([]pager.ClientStats{}, st.Exited...), rows...)
			}
			if err := writeTable(app.Stdout(), rows); err != nil {
				return err
			}
			if err := writePool(app.Stdout(), st.Pool); err != nil {
				return err
			}
			return writeProcess(app.Stdout(), st.Process)
		},
	}
	cmd.Flags().String("admin-socket", agentd.DefaultAdminSocket, "the agent's admin socket")
	cmd.Flags().Bool("json", false, "print JSON (live clients and recently exited ones)")
	cmd.Flags().Bool("all", false, "also list programs that have exited")
	return cmd
}

// uffdRunFlags are run's flags for the userfaultfd mode.
func uffdRunFlags(f *pflag.FlagSet) {
	agentFlags(f)
	f.String("shim", "", "the LD_PRELOAD shim (default: librmem.so beside the memagent binary)")
	f.Bool("stats", false, "print the program's paging stats on stderr when it exits")
	f.Bool("in-thread", false, "serve the program's page faults in its faulting threads (a SIGBUS handler and the fault ring) instead of in the kernel: no wake-up across CPUs per miss (docs/pager.md, Misses in the faulting thread)")
	f.String("admin-socket", agentd.DefaultAdminSocket, "admin socket of the agent already running at --socket, where --stats reads")
	f.Bool("trace", false, "page CMD from outside it, under ptrace, even if the shim could reach it (the default for statically linked and Go programs: docs/pager.md, Programs the shim cannot reach)")
}

// metricsFlagErr names --metrics-listen in err when its listener could
// not start.
func metricsFlagErr(app *cli.App, err error) error {
	if me := (*metricsrv.Error)(nil); errors.As(err, &me) {
		return app.Invalid("metrics-listen", "%v", me.Err)
	}
	return err
}

// shimPath finds the shim: --shim, or librmem.so beside this binary.
func shimPath(app *cli.App) (string, error) {
	p := app.String("shim")
	if p == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", err
		}
		p = filepath.Join(filepath.Dir(exe), "librmem.so")
	}
	if _, err := os.Stat(p); err != nil {
		return "", app.Invalid("shim", "no shim at %s (build it with 'make', which installs bin/librmem.so beside the binaries): %v", p, err)
	}
	return filepath.Abs(p)
}

// agentListening reports whether an agent accepts connections at path. An
// agent whose socket this user may not open is an error, not a reason to
// start another one.
func agentListening(path string) (bool, error) {
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err == nil {
		c.Close()
		return true, nil
	}
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		who := strconv.Itoa(os.Getuid())
		if u, err := user.Current(); err == nil {
			who = u.Username
		}
		return false, fmt.Errorf("the agent at %s does not let user %s in (permission denied): its operator can start it with --allow-user %s or --allow-group GROUP", path, who, who)
	}
	return false, nil
}

// runUffd is `memagent run` in userfaultfd mode: CMD runs with the shim,
// served by the agent at --socket, or by one started for the duration.
func runUffd(ctx context.Context, app *cli.App, args []string) (int, error) {
	shim, err := shimPath(app)
	if err != nil {
		return -1, err
	}
	localMem, err := app.Size("local-mem")
	if err != nil {
		return -1, err
	}
	opts, err := agentOptions(app, localMem)
	if err != nil {
		return -1, err
	}
	showStats, err := app.Bool("stats")
	if err != nil {
		return -1, err
	}
	inThread, err := app.Bool("in-thread")
	if err != nil {
		return -1, err
	}
	log := app.Log()
	catcher := childproc.Catch()
	defer catcher.Stop()

	var d *agentd.Daemon
	socket := opts.Socket
	askBudget, askSlowdown := false, false
	listening, err := agentListening(socket)
	if err != nil {
		return -1, err
	}
	if listening {
		// CMD asks that agent for --local-mem (HELLO); without it, the
		// agent's own --local-mem applies.
		askBudget = app.IsSet("local-mem")
		askSlowdown = app.IsSet("max-slowdown") && opts.MaxSlowdown > 0
		if opts.MetricsListen != "" {
			return -1, app.Invalid("metrics-listen", "the agent already running at %s pages CMD and has the metrics: give it --metrics-listen", socket)
		}
		log.Info("using the agent already running", zap.String("socket", socket), zap.Bool("own-local-mem", askBudget), zap.Bool("own-max-slowdown", askSlowdown))
	} else {
		// A private socket, so that this agent never takes over another's.
		removeStaleRunSockets(filepath.Dir(socket), log)
		socket = filepath.Join(filepath.Dir(socket), "memagent-run-"+strconv.Itoa(os.Getpid())+".sock")
		opts.Socket = socket
		if opts.Pool, err = swapPoolClient(ctx, app); err != nil {
			return -1, err
		}
		if d, err = agentd.Start(ctx, opts); err != nil {
			return -1, metricsFlagErr(app, err)
		}
		defer d.Close()
	}

	trace, err := app.Bool("trace")
	if err != nil {
		return -1, err
	}
	reach := "--trace"
	if !trace {
		reach = ""
		if path, err := exec.LookPath(args[0]); err == nil {
			reach = traced.Reach(path)
		}
	}
	if reach != "" && inThread {
		return -1, app.Invalid("in-thread", "CMD is paged from outside it (%s): its faults cannot come through a shim's fault ring", reach)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	env := os.Environ()
	if reach == "" {
		env = withPreload(env, shim)
	}
	cmd.Env = append(env,
		proto.EnvSocket+"="+socket, proto.EnvMinAlloc+"="+strconv.FormatUint(opts.MinAlloc, 10))
	if askBudget {
		cmd.Env = append(cmd.Env, proto.EnvLocalMem+"="+strconv.FormatUint(uint64(localMem), 10))
	}
	if askSlowdown {
		cmd.Env = append(cmd.Env, proto.EnvMaxSlowdown+"="+strconv.FormatUint(uint64(math.Round(opts.MaxSlowdown*1e6)), 10))
	}
	if inThread {
		cmd.Env = append(cmd.Env, proto.EnvInThread+"=1")
	}
	if d != nil {
		// CMD's pages in the pool live and die with this private agent
		// (it keeps no journal): if memagent run is killed, CMD is killed
		// with it rather than left to fault on pages no agent has. The
		// death signal follows the thread that forked CMD: it stays
		// locked, waiting, for the whole run.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	var code, pid int
	var maxRSS int64 // KiB, wait4's
	if reach != "" {
		// No shim in CMD: it is paged from outside, under ptrace.
		log.Info("paging the program from outside it (the shim cannot reach it)", zap.String("why", reach))
		to := traced.Options{Socket: socket, Signals: catcher.Signals(), Log: log}
		if askBudget {
			to.LocalMem = uint64(localMem)
		}
		if askSlowdown {
			to.MaxSlowdown = uint32(math.Round(opts.MaxSlowdown * 1e6))
		}
		var res traced.Result
		res, err = traced.Run(ctx, cmd, to)
		code, pid, maxRSS = res.Code, res.PID, res.Rusage.Maxrss
	} else {
		code, err = catcher.Run(ctx, cmd)
		if cmd.Process != nil {
			pid = cmd.Process.Pid
		}
		if cmd.ProcessState != nil {
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				maxRSS = ru.Maxrss
			}
		}
	}
	if err != nil {
		return code, err
	}
	if showStats {
		printRunStats(ctx, app, d, pid)
		if maxRSS > 0 {
			// Linux reports ru_maxrss in KiB: the program's VmHWM, paged
			// memory and everything else it maps (code, libraries, stacks).
			fmt.Fprintf(os.Stderr, "program: peak resident %.1fMiB (VmHWM, all of its memory)\n", float64(maxRSS)/1024)
		}
	}
	return code, nil
}

// removeStaleRunSockets removes the private sockets of `memagent run`s
// that are gone (killed: nothing removed theirs).
func removeStaleRunSockets(dir string, log *zap.Logger) {
	names, _ := filepath.Glob(filepath.Join(dir, "memagent-run-*.sock"))
	for _, name := range names {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "memagent-run-"), ".sock"))
		if err != nil || syscall.Kill(pid, 0) == nil || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		if os.Remove(name) == nil {
			log.Info("removed the socket of a memagent run that is gone", zap.String("socket", name))
		}
	}
}

// withPreload returns env with shim first in LD_PRELOAD.
func withPreload(env []string, shim string) []string {
	out := make([]string, 0, len(env)+1)
	pre := shim
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			if v != "" {
				pre += ":" + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_PRELOAD="+pre)
}

// printRunStats prints the final stats of the program (and of the children
// it forked) on stderr, waiting briefly for the agent to see it exit.
func printRunStats(ctx context.Context, app *cli.App, d *agentd.Daemon, pid int) {
	var rows []pager.ClientStats
	var fetchErr error
	deadline := time.Now().Add(3 * time.Second)
	for {
		var exited []pager.ClientStats
		if d != nil {
			exited = d.Agent.Exited()
		} else if st, err := agentd.FetchStats(ctx, app.String("admin-socket")); err == nil {
			exited, fetchErr = st.Exited, nil
		} else {
			fetchErr = err
			if errors.Is(err, syscall.EACCES) {
				break // it will not change
			}
		}
		// Wait for the program's own row: children it forked (their rows
		// are printed too with a private agent) often exit before it.
		rows = rows[:0]
		own := false
		for _, s := range exited {
			if s.PID == pid {
				own = true
			}
			if d != nil || s.PID == pid {
				rows = append(rows, s)
			}
		}
		if own || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	switch {
	case len(rows) == 0 && fetchErr != nil:
		fmt.Fprintf(os.Stderr, "memagent: no paging stats: the agent's admin socket: %v\n", fetchErr)
		return
	case len(rows) == 0:
		fmt.Fprintln(os.Stderr, "memagent: no paging stats: the program made no allocation of --min-alloc or more")
		return
	}
	if err := writeTable(os.Stderr, rows); err != nil {
		app.Log().Warn("stats", zap.Error(err))
	}
	if d != nil {
		writePool(os.Stderr, d.Agent.Pool())
		writeProcess(os.Stderr, d.ProcessCPU())
	}
}
