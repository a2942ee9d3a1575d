package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
	"rmem/internal/swapdev"
	"rmem/internal/swaprun"
)

func newSwaponCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "swapon FILE",
		Short: "Swap to a pool swap file: loop device with direct I/O, mkswap, swapon",
		Long: `swapon attaches FILE (normally DIR/swap of 'memagent mount DIR') to a free
loop device with direct I/O, formats it with mkswap and enables it with
swapon. 'memagent swapoff FILE' undoes all of it. Needs root.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prio, err := app.Int("priority", -1, 32767)
			if err != nil {
				return err
			}
			dev, err := swapdev.On(cmd.Context(), args[0], prio)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(app.Stdout(), "%s: swap on %s\n", args[0], dev)
			return err
		},
	}
	cmd.Flags().Int("priority", -1, "swap priority, 0 to 32767 (-1: the kernel's default)")
	return cmd
}

func newSwapoffCmd(app *cli.App) *cobra.Command {
	return &cobra.Command{
		Use:   "swapoff FILE",
		Short: "Stop swapping to a pool swap file and detach its loop device",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return swapdev.Off(cmd.Context(), args[0])
		},
	}
}

// swapRunOptions reads the flags of `memagent run --mode swap`. The run
// command (whichever file declares it) calls it with its App and the
// command line after "--", then swaprun.Run.
func swapRunOptions(app *cli.App, command []string) (swaprun.Options, error) {
	local, err := app.Size("local-mem")
	if err != nil {
		return swaprun.Options{}, err
	}
	if local < 1<<20 {
		return swaprun.Options{}, app.Invalid("local-mem", "must be at least 1MiB")
	}
	size, err := app.Size("swap-size")
	if err != nil {
		return swaprun.Options{}, err
	}
	grace, err := app.Duration("oom-grace")
	if err != nil {
		return swaprun.Options{}, err
	}
	if grace == 0 {
		grace = -1 // the kernel's default: kill at once
	}
	mountArgs := swapPoolArgs(app)
	for _, k := range []string{"log-level", "log-format"} {
		if app.IsSet(k) {
			mountArgs = append(mountArgs, "--"+k+"="+app.String(k))
		}
	}
	return swaprun.Options{
		Command: command, LocalMem: uint64(local), SwapSize: uint64(size),
		Dir: app.String("swap-dir"), MountArgs: mountArgs, OOMGrace: grace,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Log: app.Log().Named("swaprun"),
	}, nil
}

// swapRunFlags declares the flags of swap mode.
func swapRunFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("swap-size", "4GiB", "swap mode: size of the pool swap file set up when none is active")
	f.String("swap-dir", "", "swap mode: where to mount that swap file (default: a new directory under /run/rmem)")
	f.String("oom-grace", "20s", "swap mode, cgroup v1: how long CMD may wait at its limit with none of its pages moving before the OOM killer may act (0: at once)")
	if f.Lookup("coordinator") == nil {
		poolFlags(f)
	}
}

// newRunCmd is `memagent run`: userfaultfd mode (runUffd, the default) or
// swap mode (swaprun).
func newRunCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run [--local-mem SIZE] [--min-alloc SIZE] [--replicas R] [--mode uffd|swap] -- CMD [ARG...]",
		Short: "Run a program with its memory beyond --local-mem paged to the pool",
		Long: `run runs CMD with at most --local-mem of its memory resident; the rest goes
to pool memory. The exit status and signals of CMD pass through, and its
standard streams are its own. Needs root, unless the agent running at
--socket serves this user (memagent serve --allow-user or --allow-group).

In uffd mode (the default) CMD runs with the LD_PRELOAD shim (librmem.so):
its allocations of --min-alloc or more are served by the agent through
userfaultfd, which fetches and evicts their pages. The agent listening on
--socket serves it, keeping CMD (and each process it forks) under --local-mem
when given, else under that agent's own --local-mem; when none is running,
run starts one for the duration. --stats prints CMD's paging figures on stderr when it exits.

In swap mode CMD runs in a memory cgroup limited to --local-mem and the
kernel swaps its overflow to a pool swap file; if no pool swap file is
active, run mounts one (a separate 'memagent mount' process) and turns it on
for the duration. If run is killed (kill -9), CMD is killed with it; what is
left is removed by the next swap-mode run or by 'memagent cleanup'.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := app.OneOf("mode", "uffd", "swap")
			if err != nil {
				return err
			}
			var code int
			if mode == "uffd" {
				code, err = runUffd(cmd.Context(), app, args)
			} else {
				if app.IsSet("max-slowdown") {
					return app.Invalid("max-slowdown", "steers the budget of --mode uffd only (a swap-mode run's budget is its cgroup's limit)")
				}
				var opts swaprun.Options
				if opts, err = swapRunOptions(app, args); err != nil {
					return err
				}
				code, err = swaprun.Run(cmd.Context(), opts)
				if err != nil && code >= 0 {
					// CMD ran: its status is run's, whatever went wrong in
					// the teardown.
					fmt.Fprintf(os.Stderr, "memagent: %v\n", err)
					err = nil
				}
			}
			if err != nil {
				return err
			}
			os.Exit(code)
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // flags after CMD are its own
	f.String("mode", "uffd", "how pages leave: uffd (shim + userfaultfd, the default) or swap (memory cgroup + pool swap file)")
	f.String("local-mem", "512MiB", "memory CMD may keep resident")
	uffdRunFlags(f)
	poolFlags(f)
	swapRunFlags(cmd)
	return cmd
}

// newCleanupCmd is `memagent cleanup`: what killed swap-mode runs left.
func newCleanupCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what killed swap-mode runs left: cgroups, and pool swap files no run uses",
		Long: `cleanup removes what 'memagent run --mode swap' runs that were killed (kill -9)
left behind, as the next run does when it starts: the memory cgroups of runs
whose process is gone (killing what is still in them), and, when no run is in
progress, the pool swap files that runs set up (swapoff, loop device detached,
unmounted, daemon ended). A pool swap file is never taken down under a live
run. It prints one line per thing removed or kept. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := swaprun.Cleanup(swaprun.CleanupOptions{RuntimeDir: app.String("runtime-dir"), Log: app.Log().Named("swaprun")})
			w := app.Stdout()
			for _, r := range c.Removed {
				fmt.Fprintf(w, "removed %s\n", r)
			}
			for _, k := range c.Kept {
				fmt.Fprintf(w, "kept %s\n", k)
			}
			if len(c.Removed)+len(c.Kept) == 0 && err == nil {
				fmt.Fprintln(w, "nothing to clean up")
			}
			return err
		},
	}
	cmd.Flags().String("runtime-dir", "/run/rmem", "where the runs' state is (swaprun.json)")
	return cmd
}
