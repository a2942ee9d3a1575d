package traced_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"rmem/pager"
	"rmem/pager/pagertest"
	"rmem/traced"
	"rmem/userfaultfd"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// staticProg builds testdata/prog.c statically linked, or skips.
func staticProg(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	bin := filepath.Join(t.TempDir(), "prog")
	if out, err := exec.Command("gcc", "-O2", "-static", "-pthread", "-o", bin, "testdata/prog.c").CombinedOutput(); err != nil {
		t.Skipf("cannot link statically (Debian package libc6-dev): %v\n%s", err, out)
	}
	return bin
}

func TestReach(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got := traced.Reach(self); got != "go" && got != "static" {
		t.Errorf("Reach(this Go test binary) = %q, want go (or static)", got)
	}
	if sh, err := exec.LookPath("sh"); err == nil {
		if got := traced.Reach(sh); got != "" {
			t.Errorf("Reach(%s) = %q, want \"\" (the shim reaches it)", sh, got)
		}
	}
	if got := traced.Reach("testdata/prog.c"); got != "" {
		t.Errorf("Reach(a C source) = %q, want \"\"", got)
	}
	if got := traced.Reach(staticProg(t)); got != "static" {
		t.Errorf("Reach(gcc -static) = %q, want static", got)
	}
}

// startAgent runs an agent of this process (a budget of 4 MiB, the pool
// in memory) at a socket of its own until the test ends, or skips where
// one cannot serve another process's userfaultfd. stop ends it sooner.
func startAgent(t *testing.T) (a *pager.Agent, sock string, stop func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent serves another process's userfaultfd")
	}
	if _, _, err := userfaultfd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	store := pagertest.New(t, pagertest.Options{})
	sock = filepath.Join(t.TempDir(), "agent.sock")
	a, err := pager.New(pager.Options{Socket: sock, Store: store, LocalMem: 4 << 20, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			a.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return a, sock, stop
}

// TestRunStatic pages a static program from outside it, with an agent of
// this process at a budget of a quarter of its data, and compares its
// output with a plain run: malloc's chunks and brk heap, a realloc whose
// mremap is refused, dropped pages reading zeros, threads, its own
// SIGSEGV handler, fork (the child is paged on its own, its writes its
// own) and exec (the new image is paged anew) — testdata/prog.c checks
// every byte.
func TestRunStatic(t *testing.T) {
	a, sock, _ := startAgent(t)
	prog := staticProg(t)
	want, err := exec.Command(prog).Output()
	if err != nil {
		t.Fatalf("plain run: %v", err)
	}
	log := zaptest.NewLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.Command(prog)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	res, err := traced.Run(ctx, cmd, traced.Options{Socket: sock, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 0 || out.String() != string(want) {
		t.Fatalf("traced run: exit %d, output %q; plain run %q", res.Code, out.String(), want)
	}
	// The image before the exec and the one after, and the forked child.
	var faults, child []uint64
	deadline := time.Now().Add(3 * time.Second)
	for (len(faults) < 2 || len(child) < 1) && time.Now().Before(deadline) {
		faults, child = faults[:0], child[:0]
		for _, s := range a.Exited() {
			if s.PID == res.PID {
				faults = append(faults, s.Faults)
			} else {
				child = append(child, s.RemoteReads) // pages read from the pool, faulted or prefetched
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(faults) // the order clients exit in is the agent's
	if len(faults) != 2 || faults[1] < 1000 || faults[0] == 0 {
		t.Fatalf("the agent served faults %v of pid %d (want two images, one with >= 1000)", faults, res.PID)
	}
	if len(child) != 1 || child[0] < 1000 {
		t.Fatalf("the forked child read %v pages from the pool (want one child with >= 1000: it reads its copy back)", child)
	}
	t.Logf("faults served: %v; pages the forked child read from the pool: %v", faults, child)
}

// TestHelloTracedRefused: an agent refuses a HELLO that speaks for a
// process the sender does not trace.
func TestHelloTracedRefused(t *testing.T) {
	_, sock, _ := startAgent(t)
	err := traced.HelloFor(sock, os.Getppid())
	if err == nil || !strings.Contains(err.Error(), "does not trace") {
		t.Fatalf("HELLO for a process not traced: %v, want a refusal", err)
	}
}

// TestAgentLost: a traced program whose agent goes away is killed, not
// left waiting for good on an evicted page (no other agent can resume it).
func TestAgentLost(t *testing.T) {
	a, sock, stop := startAgent(t)
	prog := staticProg(t)
	log := zaptest.NewLogger(t)
	type ran struct {
		res traced.Result
		err error
	}
	out := make(chan ran, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		res, err := traced.Run(ctx, exec.Command(prog, "spin"), traced.Options{Socket: sock, Log: log})
		out <- ran{res, err}
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st := a.Stats(); len(st) == 1 && st[0].Evictions > 1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the program was not paged: %+v", a.Stats())
		}
	}
	stop()
	r := <-out
	if r.err != nil || r.res.Code != 128+9 {
		t.Fatalf("after the agent went away: %+v, %v; want killed (exit %d)", r.res, r.err, 128+9)
	}
}
