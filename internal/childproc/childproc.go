// Package childproc runs the command of `memagent run` as a child whose
// signals and exit status pass through: the signals a terminal or a service
// manager sends to memagent go to the child, and memagent exits as the child
// did. It is not a process supervisor (no restarts, no process groups).
package childproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// Forwarded are the signals passed on to the child.
var Forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Catcher holds the forwarded signals from the moment it is made, so that
// one arriving while the caller sets up is delivered to the child once it
// starts, instead of killing the parent half-way through its set-up.
type Catcher struct{ sigs chan os.Signal }

// Catch starts catching the forwarded signals. Stop must be called.
func Catch() *Catcher {
	c := &Catcher{sigs: make(chan os.Signal, 8)}
	signal.Notify(c.sigs, Forwarded...)
	return c
}

// Stop stops catching.
func (c *Catcher) Stop() { signal.Stop(c.sigs) }

// Signals returns the signals caught, for a caller that runs its child
// itself (package traced) to forward.
func (c *Catcher) Signals() <-chan os.Signal { return c.sigs }

// Run starts cmd, passes the caught signals to it until it ends and returns
// its exit code, shell-style: the status it exited with, or 128+N when
// signal N ended it. If ctx ends first, cmd is killed and ctx.Err()
// returned. err is set only when cmd could not be started or waited for.
func (c *Catcher) Run(ctx context.Context, cmd *exec.Cmd) (int, error) {
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	for {
		select {
		case s := <-c.sigs:
			cmd.Process.Signal(s)
		case <-ctx.Done():
			cmd.Process.Kill()
			<-waited
			return -1, ctx.Err()
		case err := <-waited:
			return ExitCode(cmd, err)
		}
	}
}

// ExitCode turns the end of cmd (err from Wait) into a shell-style exit code.
func ExitCode(cmd *exec.Cmd, err error) (int, error) {
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return -1, fmt.Errorf("wait for %s: %w", cmd.Path, err)
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}
