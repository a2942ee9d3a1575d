package childproc

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestExitStatusPassesThrough(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := Catch()
	defer c.Stop()
	for _, tt := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
	} {
		code, err := c.Run(context.Background(), exec.Command("/bin/sh", "-c", tt.script))
		if err != nil || code != tt.want {
			t.Errorf("%q: exit code %d, %v; want %d", tt.script, code, err, tt.want)
		}
	}
}

func TestSignalsAreForwarded(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := Catch()
	defer c.Stop()
	// The child reports SIGUSR1 by exiting 42; the signal is sent to this
	// process, as a terminal or service manager would.
	cmd := exec.Command("/bin/sh", "-c", `trap 'exit 42' USR1; echo ready; while :; do sleep 0.01; done`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 6)
		out.Read(buf) // "ready\n": the trap is set
		syscall.Kill(syscall.Getpid(), syscall.SIGUSR1)
	}()
	code, err := c.Run(context.Background(), cmd)
	if err != nil || code != 42 {
		t.Fatalf("exit code %d, %v; want 42 (SIGUSR1 forwarded)", code, err)
	}
}

func TestContextKills(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := Catch()
	defer c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Run(ctx, exec.Command("sleep", "10")); err != context.DeadlineExceeded {
		t.Fatalf("err %v, want the context's", err)
	}
}

func TestStartFailure(t *testing.T) {
	c := Catch()
	defer c.Stop()
	if _, err := c.Run(context.Background(), exec.Command("/nonexistent/program")); err == nil {
		t.Fatal("want an error")
	}
}
