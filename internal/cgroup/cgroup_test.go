package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/internal/swaptest"
)

func TestCreateBadName(t *testing.T) {
	for _, n := range []string{"", ".", "..", "a/b", "/x"} {
		if _, err := Create(n, 1<<20); !errors.Is(err, ErrName) {
			t.Errorf("Create(%q) = %v, want ErrName", n, err)
		}
	}
}

func newGroup(t *testing.T, limit uint64) *Group {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	if _, _, err := Detect(); err != nil {
		t.Skip(err)
	}
	g, err := Create(fmt.Sprintf("rmem-test-%d", os.Getpid()), limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Remove(5 * time.Second) })
	return g
}

func TestCommandRunsInGroup(t *testing.T) {
	g := newGroup(t, 32<<20)
	if _, err := Create(g.Path[strings.LastIndex(g.Path, "/")+1:], 1<<20); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Create of an existing group = %v, want EEXIST", err)
	}
	out, err := g.Command("cat", "/proc/self/cgroup").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(g.Path, v1Root)
	if g.Version == V2 {
		want = "0::" + want[strings.LastIndex(want, "/"):]
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("/proc/self/cgroup of the command:\n%s\nwant it to name %s", out, want)
	}
	// Exit status passes through the shell.
	err = g.Command("sh", "-c", "exit 7").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit 7 came back as %v", err)
	}
	u, err := g.Usage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("usage after two short commands: %+v", u)
}

func TestRemoveKillsLeftovers(t *testing.T) {
	g := newGroup(t, 32<<20)
	cmd := g.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		pids, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.Remove(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("sleep ended with %v, want SIGKILL", err)
	}
	if _, err := os.Stat(g.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("group still exists: %v", err)
	}
	if err := g.Remove(time.Second); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestParseMemoryCgroup(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"9:name=systemd:/\n4:memory:/a/b\n0::/\n", "/a/b"},
		{"5:cpu,memory:/x\n", "/x"},
		{"0::/user.slice/u.scope\n", "/user.slice/u.scope"},
	} {
		if got, err := ParseMemoryCgroup([]byte(c.in)); err != nil || got != c.want {
			t.Errorf("ParseMemoryCgroup(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "garbage", "1:cpu:/\n", "4:memory:rel\n"} {
		if _, err := ParseMemoryCgroup([]byte(bad)); err == nil {
			t.Errorf("ParseMemoryCgroup(%q) accepted", bad)
		}
	}
}

func FuzzParseMemoryCgroup(f *testing.F) {
	f.Add([]byte("4:memory:/a\n0::/\n"))
	f.Add([]byte("0::/x:y\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseMemoryCgroup(b)
		if err == nil && !strings.HasPrefix(p, "/") {
			t.Fatalf("path %q from %q", p, b)
		}
	})
}

// TestSelfInGroup: a process started with Command sees the group as its
// memory cgroup.
func TestSelfInGroup(t *testing.T) {
	g := newGroup(t, 32<<20)
	out, err := g.Command("cat", "/proc/self/cgroup").Output()
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseMemoryCgroup(out)
	if err != nil || !strings.HasSuffix(g.Path, p) {
		t.Fatalf("memory cgroup of the command %q (%v), want the end of %s", p, err, g.Path)
	}
	if self, err := Self(); err != nil || strings.HasSuffix(g.Path, self) && self != "/" {
		t.Fatalf("this test is in %q (%v)", self, err)
	}
}

// TestOOMKillOff: with the OOM killer off, a process over the limit with
// no swap to go to waits under OOM instead of dying; turning the killer
// back on kills it.
func TestOOMKillOff(t *testing.T) {
	if os.Geteuid() == 0 {
		swaptest.Lock(t)
	}
	g := newGroup(t, 8<<20)
	if g.Version != V1 {
		t.Skip("memory.oom_control is cgroup v1")
	}
	if b, err := os.ReadFile("/proc/swaps"); err != nil || strings.Count(string(b), "\n") > 1 {
		t.Skip("swap is active: the process would swap instead of waiting under OOM")
	}
	if err := g.SetOOMKill(false); err != nil {
		t.Fatal(err)
	}
	cmd := hogCommand(g) // a 64 MiB buffer
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		under, err := g.UnderOOM()
		if err != nil {
			t.Fatal(err)
		}
		if under {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the hog ended (%v) instead of waiting under OOM", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("not under OOM after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := g.SetOOMKill(true); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the hog ended with %v, want killed by the OOM killer", err)
	}
}

// hogEnv makes the test binary a child that writes every page of 64 MiB
// from user space (a read(2) into the buffer would just come back short at
// the limit).
const hogEnv = "RMEM_TEST_HOG"

func runHogIfChild() {
	if os.Getenv(hogEnv) == "" {
		return
	}
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	os.Exit(0)
}

func hogCommand(g *Group) *exec.Cmd {
	cmd := g.Command(os.Args[0])
	cmd.Env = append(os.Environ(), hogEnv+"=1")
	return cmd
}

func TestMain(m *testing.M) {
	runHogIfChild()
	os.Exit(m.Run())
}

// TestNudge: a nudge leaves the limit as it was, with processes in the
// group or not; and memory.stat parses.
func TestNudge(t *testing.T) {
	g := newGroup(t, 32<<20)
	if g.Version != V1 {
		if err := g.Nudge(); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("Nudge in v2 = %v, want ErrNotSupported", err)
		}
		return
	}
	if err := g.Nudge(); err != nil {
		t.Fatal(err)
	}
	if l, err := readUint(g.Path + "/memory.limit_in_bytes"); err != nil || l != 32<<20 {
		t.Fatalf("limit after a nudge: %d, %v", l, err)
	}
	st, err := g.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st["pgpgin"]; !ok {
		t.Fatalf("memory.stat without pgpgin: %v", st)
	}
	if n, err := g.OOMKills(); err != nil || n != 0 {
		t.Fatalf("OOMKills = %d, %v", n, err)
	}
}
