package tests

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/internal/cgroup"
	"rmem/internal/swapdev"
	"rmem/internal/swaprun"
	"rmem/internal/swaptest"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/swapfs"
	"rmem/tests/internal/memdtest"
)

// The swap tests run real processes against the kernel: a pool (memd), the
// FUSE daemon (memagent mount), loop devices, swapon and a v1/v2 memory
// cgroup. Every one of them is undone in t.Cleanup even when the test
// fails: a leaked swap device or loop device breaks later tests.

var (
	swapBuildMu sync.Mutex
	swapBuilt   = map[string]string{}
)

// swapBuild builds ./cmd/NAME once per test binary and returns its path.
func swapBuild(tb testing.TB, name string) string {
	tb.Helper()
	swapBuildMu.Lock()
	defer swapBuildMu.Unlock()
	if p, ok := swapBuilt[name]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "swaptest-bin-")
	if err != nil {
		tb.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = filepath.Join(filepath.Dir(file), "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	swapBuilt[name] = bin
	return bin
}

func swapMemagent(tb testing.TB) string { return swapBuild(tb, "memagent") }

// swapWorkloadC allocates MiB mebibytes and writes a pattern into every
// 8-byte word; says "written"; then verifies every word twice ("seq",
// "wait") or reads 100k random words ("rand"). With "wait" it waits for a
// line on stdin after writing and after the first verifying pass. It prints the time from its first write to its last check.
const swapWorkloadC = `
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static uint64_t pat(size_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ll + t.tv_nsec; }
int main(int argc, char **argv) {
	size_t n = ((size_t)atol(argv[1]) << 20) / 8;
	const char *mode = argc > 2 ? argv[2] : "seq";
	uint64_t *p = malloc(n * 8);
	if (!p) { perror("malloc"); return 2; }
	long long t0 = now();
	for (size_t i = 0; i < n; i++) p[i] = pat(i);
	printf("written\n"); fflush(stdout);
	if (strcmp(mode, "wait") == 0) { char b[8]; if (!fgets(b, sizeof b, stdin)) return 3; }
	if (strcmp(mode, "rand") == 0) {
		uint64_t x = 88172645463325252ull;
		for (int k = 0; k < 100000; k++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			size_t i = x % n;
			if (p[i] != pat(i)) { fprintf(stderr, "word %zu: %llx\n", i, (unsigned long long)p[i]); return 1; }
		}
	} else {
		for (int pass = 0; pass < 2; pass++) {
			for (size_t i = 0; i < n; i++)
				if (p[i] != pat(i)) { fprintf(stderr, "word %zu: %llx\n", i, (unsigned long long)p[i]); return 1; }
			if (pass == 0 && strcmp(mode, "wait") == 0) {
				printf("pass 1 verified\n"); fflush(stdout);
				char b[8]; if (!fgets(b, sizeof b, stdin)) return 3;
			}
		}
	}
	printf("verified %zu words\n", n);
	printf("time_ns %lld\n", now() - t0);
	return 0;
}
`

func swapNeeds(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes and swaps")
	}
	if os.Geteuid() != 0 {
		t.Skip("FUSE mount(2), loop devices, swapon and cgroups need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	for _, c := range []string{"losetup", "mkswap", "swapon", "swapoff", "cc"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s not installed", c)
		}
	}
	if _, _, err := cgroup.Detect(); err != nil {
		t.Skip(err)
	}
	swaptest.Lock(t)
}

// swapWorkload compiles the workload into the test's temp dir.
func swapWorkload(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "work.c"), filepath.Join(dir, "work")
	if err := os.WriteFile(src, []byte(swapWorkloadC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return bin
}

type swapPool struct {
	url     string
	cl      *client.Client
	servers map[pool.ServerID]*memdtest.Proc
}

// swapStartPool starts a coordinator and n memory servers of 512 MiB in
// 16 MiB slabs.
func swapStartPool(t *testing.T, n int) *swapPool {
	t.Helper()
	bin := memdtest.Build(t)
	dir := t.TempDir()
	addr := memdtest.FreeAddr(t)
	p := &swapPool{url: "http://" + addr, servers: map[pool.ServerID]*memdtest.Proc{}}
	memdtest.Start(t, "coordinator", bin, "serve", "--role", "coordinator", "--listen", addr, "--token", memdToken,
		"--data-dir", filepath.Join(dir, "data"), "--runtime-dir", filepath.Join(dir, "run"),
		"--slab-size", "16MiB", "--heartbeat-timeout", "1s", "--sweep-interval", "100ms")
	var err error
	if p.cl, err = client.New(p.url, client.Options{Token: memdToken, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cl.CloseIdleConnections)
	for i := range n {
		id := fmt.Sprintf("s%d", i+1)
		p.servers[pool.ServerID(id)] = memdtest.Start(t, id, bin, "serve", "--role", "server", "--id", id,
			"--coordinator", p.url, "--token", memdToken, "--listen", memdtest.FreeAddr(t),
			"--tcp-listen", "127.0.0.1:0", "--shm-socket", "off", "--capacity", "512MiB", "--slab-size", "16MiB",
			"--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s",
			"--runtime-dir", filepath.Join(dir, "run-"+id), memdtest.MlockFlag(t, 512<<20))
	}
	memdtest.Eventually(t, 20*time.Second, fmt.Sprintf("%d servers up", n), func() error {
		st, err := p.cl.Status(context.Background())
		if err == nil && st.ServersUp != n {
			err = fmt.Errorf("%d servers up", st.ServersUp)
		}
		return err
	})
	return p
}

func (p *swapPool) args() []string {
	return []string{"--coordinator", p.url, "--token", memdToken}
}

// swapCleanup undoes, at the end of the test, whatever a swap file in dir
// may have left: swap, loop devices, the mount, the cgroup of a run.
func swapCleanup(t *testing.T, dir string) {
	t.Cleanup(func() {
		file := filepath.Join(dir, swapfs.SwapName)
		if err := swapdev.Off(context.Background(), file); err == nil {
			t.Errorf("cleanup: %s was still swap or attached", file)
		} else if !errors.Is(err, swapdev.ErrNotSwap) {
			t.Errorf("cleanup: %v", err)
		}
		if ok, _ := swaprun.SwapMounted(dir); ok {
			t.Errorf("cleanup: %s was still mounted", dir)
			// Not lazily: a loop device still on it would hold a detached
			// mount nobody can reach any more.
			if err := unix.Unmount(dir, 0); err != nil {
				t.Errorf("cleanup: umount %s: %v", dir, err)
			}
		}
	})
}

func swapNoLeftovers(t *testing.T, dir string, runPID int) {
	t.Helper()
	if loops, err := swapdev.LoopsOf(filepath.Join(dir, swapfs.SwapName)); err != nil || len(loops) != 0 {
		t.Errorf("loop devices left: %+v %v", loops, err)
	}
	if ok, err := swaprun.SwapMounted(dir); err != nil || ok {
		t.Errorf("%s still mounted (%v)", dir, err)
	}
	if runPID != 0 {
		_, root, _ := cgroup.Detect()
		if _, err := os.Stat(filepath.Join(root, "rmem-run-"+strconv.Itoa(runPID))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup of the run left: %v", err)
		}
	}
	if active, err := swaprun.ActivePoolSwaps(); err != nil || len(active) != 0 {
		t.Errorf("pool swap still active: %v %v", active, err)
	}
}

func swapStats(t *testing.T, dir string) swapfs.Stats {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, swapfs.StatsName))
	if err != nil {
		t.Fatal(err)
	}
	s, err := swapfs.ParseStats(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// swapRun is `memagent run --mode swap` running the workload, which waits
// after writing for a line on its stdin.
type swapRun struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	// out is a file, not a pipe: a mount daemon that run leaves to other
	// runs keeps run's stderr open, and Wait must not wait for it.
	out *os.File
}

func swapStartRun(t *testing.T, args ...string) *swapRun {
	t.Helper()
	r := &swapRun{cmd: exec.Command(swapMemagent(t), args...), lines: make(chan string, 16)}
	r.cmd.Env = append(os.Environ(), "MEMAGENT_LOG_FORMAT=console")
	var err error
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if r.out, err = os.CreateTemp(t.TempDir(), "run-stderr-"); err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		r.cmd.Process.Signal(syscall.SIGTERM) // forwarded to the workload; run then tears down
		r.stdin.Close()
		done := make(chan struct{})
		go func() { r.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			r.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("--- memagent run:\n%s", r.output())
		}
	})
	return r
}

func (r *swapRun) output() string {
	b, _ := os.ReadFile(r.out.Name())
	return string(b)
}

// expect waits for a line of the workload starting with prefix.
func (r *swapRun) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(90 * time.Second)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("workload output ended before %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("no %q from the workload within 90s", prefix)
		}
	}
}

func (r *swapRun) wait(t *testing.T) int {
	t.Helper()
	err := r.cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return r.cmd.ProcessState.ExitCode()
}

// swapWorkloadRun runs the 256 MiB workload in a 64 MiB cgroup with a pool
// swap file set up by run itself. It calls kill (if not nil) between the
// writing and the first verifying pass, and then check between the two
// verifying passes.
func swapWorkloadRun(t *testing.T, p *swapPool, replicas int, kill, check func(dir string)) {
	dir := t.TempDir()
	swapCleanup(t, dir)
	work := swapWorkload(t)
	args := append([]string{"run", "--mode", "swap", "--local-mem", "64MiB", "--swap-size", "1GiB",
		"--swap-dir", dir, "--replicas", strconv.Itoa(replicas)}, p.args()...)
	r := swapStartRun(t, append(args, "--", work, "256", "wait")...)
	r.expect(t, "written")

	// 256 MiB written under a 64 MiB limit: at least 192 MiB is out, in
	// pool slabs. The kernel may still be writing swap out after the
	// workload's line (a slab being allocated is in the pool's list before
	// the swap file counts it), so the two counts are compared until they
	// agree.
	var s swapfs.Stats
	var slabs []pool.SlabView
	memdtest.Eventually(t, 10*time.Second, "the pool's slabs and the swap file's agree", func() error {
		s = swapStats(t, dir)
		var err error
		if slabs, err = p.cl.Slabs(context.Background(), client.SlabFilter{}); err != nil {
			return err
		}
		if uint64(len(slabs)) != s.Slabs {
			return fmt.Errorf("pool holds %d slabs, the swap file %d", len(slabs), s.Slabs)
		}
		return nil
	})
	t.Logf("after writing: %+v", s)
	if s.PoolWriteBytes < 150<<20 || s.Slabs < 10 || s.Errors != 0 {
		t.Errorf("swap traffic did not go to pool slabs: %+v", s)
	}
	for _, sv := range slabs {
		if len(sv.Replicas) != replicas {
			t.Errorf("slab %d has %d replicas, want %d", sv.ID, len(sv.Replicas), replicas)
		}
	}
	if kill != nil {
		kill(dir)
	}
	fmt.Fprintln(r.stdin, "go")
	r.expect(t, "pass 1 verified")
	if check != nil {
		check(dir)
	}
	fmt.Fprintln(r.stdin, "go")
	r.expect(t, "verified 33554432 words")
	if code := r.wait(t); code != 0 {
		t.Fatalf("memagent run exited %d", code)
	}
	swapNoLeftovers(t, dir, r.cmd.Process.Pid)
	if kill != nil {
		return
	}
	memdtest.Eventually(t, 10*time.Second, "the swap file's slabs freed", func() error {
		st, err := p.cl.Status(context.Background())
		if err == nil && st.Used != 0 {
			err = fmt.Errorf("%d bytes still used", st.Used)
		}
		return err
	})
}

// TestSwapRun: `memagent run --mode swap` alone against a running pool: a
// workload touching 256 MiB in a 64 MiB cgroup verifies every word, its
// overflow went to pool slabs, and nothing is left afterwards. Exit
// statuses and signals of the command pass through.
func TestSwapRun(t *testing.T) {
	swapNeeds(t)
	p := swapStartPool(t, 1)
	swapWorkloadRun(t, p, 1, nil, func(dir string) {
		// The first pass read back what was swapped out: from pool slabs.
		if s := swapStats(t, dir); s.PoolReadBytes < 150<<20 || s.Errors != 0 {
			t.Errorf("after a verifying pass, swap-ins did not come from pool slabs: %+v", s)
		}
	})

	for _, c := range []struct {
		script string
		code   int
	}{{"exit 3", 3}, {"kill -USR1 $$", 128 + int(syscall.SIGUSR1)}, {"true", 0}} {
		dir := t.TempDir()
		swapCleanup(t, dir)
		args := append([]string{"run", "--mode", "swap", "--local-mem", "16MiB", "--swap-size", "64MiB", "--swap-dir", dir}, p.args()...)
		r := swapStartRun(t, append(args, "--", "sh", "-c", c.script)...)
		if code := r.wait(t); code != c.code {
			t.Errorf("run -- sh -c %q exited %d, want %d", c.script, code, c.code)
		}
		swapNoLeftovers(t, dir, r.cmd.Process.Pid)
	}

	// The FUSE daemon refuses to serve from inside a run's memory cgroup.
	dir, inner := t.TempDir(), t.TempDir()
	swapCleanup(t, dir)
	swapCleanup(t, inner)
	args := append([]string{"run", "--mode", "swap", "--local-mem", "64MiB", "--swap-size", "64MiB", "--swap-dir", dir}, p.args()...)
	r := swapStartRun(t, append(append(args, "--", swapMemagent(t), "mount", inner, "--size", "64MiB"), p.args()...)...)
	if code := r.wait(t); code != 1 || !strings.Contains(r.output(), "must run outside it") {
		t.Errorf("memagent mount inside a run's cgroup: exit %d, output:\n%s", code, r.output())
	}
	swapNoLeftovers(t, dir, r.cmd.Process.Pid)
}

// TestSwapKillPrimary: with --replicas 2, kill -9 the memory server holding
// the first replica of most swap slabs between the workload's writing and
// its verifying: every word still verifies, read from the survivors, and
// the swap file's slabs get their second replica back.
func TestSwapKillPrimary(t *testing.T) {
	swapNeeds(t)
	p := swapStartPool(t, 3)
	var primary pool.ServerID
	swapWorkloadRun(t, p, 2, func(dir string) {
		slabs, err := p.cl.Slabs(context.Background(), client.SlabFilter{})
		if err != nil {
			t.Fatal(err)
		}
		first := map[pool.ServerID]int{}
		for _, sv := range slabs {
			first[sv.Replicas[0].Server]++
		}
		for id, n := range first {
			if n > first[primary] {
				primary = id
			}
		}
		t.Logf("first replicas per server %v: killing %s", first, primary)
		p.servers[primary].Kill()
	}, func(dir string) {
		// Every word was read back, through failover for the slabs whose
		// first replica died. The swap file's Store restores redundancy as the pager's does:
		// every slab gets back two healthy replicas on the survivors.
		memdtest.Eventually(t, 30*time.Second, "slabs re-replicated off "+string(primary), func() error {
			slabs, err := p.cl.Slabs(context.Background(), client.SlabFilter{})
			if err != nil {
				return err
			}
			for _, sv := range slabs {
				ok := 0
				for _, r := range sv.Replicas {
					if r.State == "ok" && r.Server != primary {
						ok++
					}
				}
				if ok != 2 {
					return fmt.Errorf("slab %d: replicas %+v", sv.ID, sv.Replicas)
				}
			}
			return nil
		})
	})
}

// TestSwapMountCLI: mount, swapon, refused unmounts (SIGTERM and
// `memagent umount`), swapoff, then a clean unmount; a failing losetup is
// reported with its command and output.
func TestSwapMountCLI(t *testing.T) {
	swapNeeds(t)
	p := swapStartPool(t, 1)
	bin := swapMemagent(t)
	dir := t.TempDir()
	swapCleanup(t, dir)
	file := filepath.Join(dir, swapfs.SwapName)
	daemon := memdtest.Start(t, "memagent mount", bin, append([]string{"mount", dir, "--size", "256MiB"}, p.args()...)...)
	memdtest.Eventually(t, 20*time.Second, "mounted", func() error {
		if daemon.Exited() {
			t.Fatalf("memagent mount exited:\n%s", daemon.Output())
		}
		if ok, err := swaprun.SwapMounted(dir); err != nil || !ok {
			return fmt.Errorf("not mounted (%v)", err)
		}
		return nil
	})
	out, errOut, err := memdtest.Run(bin, nil, "swapon", file, "--priority", "5")
	if err != nil {
		t.Fatalf("swapon: %v: %s", err, errOut)
	}
	loops, swap, err := swapdev.InUse(file)
	if err != nil || !swap || len(loops) != 1 || !loops[0].DirectIO || !strings.Contains(out, loops[0].Device) {
		t.Fatalf("after swapon (%q): loops %+v, swap %v, %v", out, loops, swap, err)
	}
	if s, on, _ := swapdev.Active(loops[0].Device); !on || s.Priority != 5 {
		t.Fatalf("swap area %+v, want priority 5", s)
	}

	// Unmounting while swap is active is refused, with the reason.
	_, errOut, err = memdtest.Run(bin, nil, "umount", dir)
	if err == nil || !strings.Contains(errOut, "active swap on "+loops[0].Device) || !strings.Contains(errOut, "swapoff") {
		t.Fatalf("umount under active swap: %v: %q", err, errOut)
	}
	daemon.Signal(syscall.SIGTERM)
	memdtest.Eventually(t, 10*time.Second, "refusal logged", func() error {
		if !strings.Contains(daemon.Output(), "refusing to unmount") {
			return errors.New("not yet")
		}
		return nil
	})
	if daemon.Exited() {
		t.Fatal("the daemon exited under active swap")
	}
	// A failing command is reported with the command line and its output.
	_, errOut, err = memdtest.Run(bin, nil, "swapon", filepath.Join(dir, "missing"))
	if err == nil || !strings.Contains(errOut, "`losetup --find --show --direct-io=on") || !strings.Contains(errOut, "failed") {
		t.Fatalf("swapon of a missing file: %v: %q", err, errOut)
	}

	if _, errOut, err := memdtest.Run(bin, nil, "swapoff", file); err != nil {
		t.Fatalf("swapoff: %v: %s", err, errOut)
	}
	if loops, swap, err := swapdev.InUse(file); err != nil || swap || len(loops) != 0 {
		t.Fatalf("after swapoff: loops %+v, swap %v, %v", loops, swap, err)
	}
	if err := daemon.Stop(20 * time.Second); err != nil {
		t.Fatalf("memagent mount after SIGTERM: %v", err)
	}
	swapNoLeftovers(t, dir, 0)
}

// swapBenchPool starts a single memd (coordinator and a 1 GiB memory
// server) for a benchmark and returns the memagent flags to reach it.
func swapBenchPool(b *testing.B) []string {
	bin := swapBuild(b, "memd")
	dir := b.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "serve", "--listen", addr, "--token", memdToken, "--data-dir", filepath.Join(dir, "data"),
		"--runtime-dir", filepath.Join(dir, "run"), "--capacity", "1GiB", "--slab-size", "16MiB",
		"--tcp-listen", "127.0.0.1:0", "--shm-socket", "off")
	logf, err := os.Create(filepath.Join(dir, "memd.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.Cleanup(func() {
		select {
		case err := <-exited:
			out, _ := os.ReadFile(logf.Name())
			b.Errorf("memd exited during the benchmark (%v):\n%s", err, out)
		default:
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
	})
	cl, err := client.New("http://"+addr, client.Options{Token: memdToken})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.CloseIdleConnections()
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if st, err := cl.Status(context.Background()); err == nil && st.ServersUp == 1 {
			break
		}
		if time.Since(start) > 20*time.Second {
			out, _ := os.ReadFile(logf.Name())
			b.Fatalf("memd not up:\n%s", out)
		}
	}
	return []string{"--coordinator", "http://" + addr, "--token", memdToken}
}

// swapBenchC runs the pager benchmark's workloads (pager/bench_test.go) on
// MiB mebibytes of malloc'ed memory: every page written, then after 200 ms
// the timed part: seq (two passes reading every 64th byte), random (200k
// uniform 8-byte reads), zipf (200k reads of pages drawn with θ = 0.99,
// hot pages spread over the range) or qsort (quicksort of random int64s).
const swapBenchC = `
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static uint64_t x = 88172645463325252ull;
static uint64_t rnd(void) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x; }
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ll + t.tv_nsec; }
static void qs(int64_t *a, long lo, long hi) {
	while (lo < hi) {
		int64_t p = a[lo + (hi - lo) / 2];
		long i = lo, j = hi;
		while (i <= j) {
			while (a[i] < p) i++;
			while (a[j] > p) j--;
			if (i <= j) { int64_t t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
		}
		if (j - lo < hi - i) { qs(a, lo, j); lo = i; } else { qs(a, i, hi); hi = j; }
	}
}
int main(int argc, char **argv) {
	size_t bytes = (size_t)atol(argv[1]) << 20, words = bytes / 8, pages = bytes / 4096;
	const char *w = argv[2];
	uint64_t *m = malloc(bytes), sum = 0;
	if (!m) { perror("malloc"); return 2; }
	for (size_t p = 0; p < pages; p++) m[p * 512] = p + 1;
	if (strcmp(w, "qsort") == 0) for (size_t i = 0; i < words; i++) m[i] = rnd();
	double *cdf = 0; size_t *perm = 0;
	if (strcmp(w, "zipf") == 0) {
		cdf = malloc(pages * sizeof *cdf); perm = malloc(pages * sizeof *perm);
		double s = 0;
		for (size_t k = 0; k < pages; k++) { s += 1 / pow(k + 1, 0.99); cdf[k] = s; }
		for (size_t k = 0; k < pages; k++) { cdf[k] /= s; perm[k] = k; }
		for (size_t k = pages - 1; k > 0; k--) { size_t j = rnd() % (k + 1), t = perm[k]; perm[k] = perm[j]; perm[j] = t; }
	}
	usleep(200000);
	long long t0 = now();
	if (strcmp(w, "seq") == 0) {
		for (int pass = 0; pass < 2; pass++)
			for (size_t i = 0; i < bytes; i += 64) sum += ((unsigned char *)m)[i];
	} else if (strcmp(w, "random") == 0) {
		for (int i = 0; i < 200000; i++) sum += m[rnd() % words];
	} else if (strcmp(w, "zipf") == 0) {
		for (int i = 0; i < 200000; i++) {
			double u = (double)(rnd() >> 11) / 9007199254740992.0;
			size_t lo = 0, hi = pages - 1;
			while (lo < hi) { size_t mid = (lo + hi) / 2; if (cdf[mid] < u) lo = mid + 1; else hi = mid; }
			sum += m[perm[lo] * 512 + rnd() % 512];
		}
	} else if (strcmp(w, "qsort") == 0) {
		qs((int64_t *)m, 0, (long)words - 1);
		for (size_t i = 1; i < words; i += 997)
			if ((int64_t)m[i - 1] > (int64_t)m[i]) { fprintf(stderr, "not sorted at %zu\n", i); return 1; }
	} else { fprintf(stderr, "unknown workload %s\n", w); return 2; }
	printf("time_ns %lld\nsum %llu\n", now() - t0, (unsigned long long)sum);
	return 0;
}
`

// swapTimeBench runs a benchmark workload (through memagent run, unless
// runArgs is empty) and returns the time it reports.
func swapTimeBench(runArgs []string, bin string, mib int, workload string) (time.Duration, error) {
	args := slices.Concat(runArgs, []string{bin, strconv.Itoa(mib), workload})
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "time_ns "); ok {
			ns, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(ns), err
		}
	}
	return 0, fmt.Errorf("no time_ns in the output of %s:\n%s", strings.Join(args, " "), out)
}

// BenchmarkSwapModes runs the pager benchmark's workloads (seq, random,
// zipf, qsort; see swapBenchC) on a 64 MiB working set all-local, in swap
// mode with 50% and 25% of it local, and in userfaultfd mode at the same
// fractions when `memagent run` has it, and prints them side by side with
// the slowdown against all-local measured in the same run. Swap mode's
// cgroup limit is the fraction plus 2 MiB for the process's own memory
// (libc, stack, page tables), which the cgroup charges and the pager's
// budget does not. Times are the workload's own; the swap file's setup is
// not counted.
//
//	go test ./tests -run '^$' -bench SwapModes -benchtime 1x
func BenchmarkSwapModes(b *testing.B) {
	swapNeeds(b)
	const mib = 64
	agent := swapMemagent(b)
	pool := swapBenchPool(b)
	dir := b.TempDir()
	bin := filepath.Join(dir, "bench")
	if err := os.WriteFile(bin+".c", []byte(swapBenchC), 0o644); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("cc", "-O2", "-o", bin, bin+".c", "-lm").CombinedOutput(); err != nil {
		b.Fatalf("cc: %v\n%s", err, out)
	}
	type mode struct {
		name string
		args []string
	}
	modes := []mode{{"local", nil}}
	run := func(m string, pct int) mode {
		local := fmt.Sprintf("%dMiB", mib*pct/100+2)
		if m == "uffd" {
			local = fmt.Sprintf("%dMiB", mib*pct/100)
		}
		return mode{fmt.Sprintf("%s-%d%%", m, pct), slices.Concat([]string{agent, "run", "--mode", m, "--local-mem", local}, pool, []string{"--"})}
	}
	modes = append(modes, run("swap", 50), run("swap", 25))
	help, _ := exec.Command(agent, "run", "--help").CombinedOutput()
	if strings.Contains(string(help), "uffd") {
		// uffd mode needs the shim beside the memagent binary.
		_, file, _, _ := runtime.Caller(0)
		mk := exec.Command("make", "shim", "BIN="+filepath.Dir(agent))
		mk.Dir = filepath.Join(filepath.Dir(file), "..")
		if out, err := mk.CombinedOutput(); err != nil {
			fmt.Printf("make shim failed, uffd columns left out: %v\n%s\n", err, out)
		} else {
			modes = append(modes, run("uffd", 50), run("uffd", 25))
		}
	} else {
		fmt.Println("memagent run has no uffd mode in this build: its columns are left out")
	}
	var table strings.Builder
	fmt.Fprintf(&table, "%-7s", "")
	for _, m := range modes {
		fmt.Fprintf(&table, " %17s", m.name)
	}
	for _, w := range []string{"seq", "random", "zipf", "qsort"} {
		var row string // of the last call of the sub-benchmark (the one with the final b.N)
		b.Run(w, func(b *testing.B) {
			row = fmt.Sprintf("\n%-7s", w)
			sum := make([]time.Duration, len(modes))
			failed := make([]bool, len(modes))
			for range b.N {
				for i, m := range modes {
					if failed[i] {
						continue
					}
					d, err := swapTimeBench(m.args, bin, mib, w)
					if err != nil && strings.HasPrefix(m.name, "uffd") {
						// Another package's mode: report, do not stop the others.
						b.Logf("%s %s failed: %v", w, m.name, err)
						failed[i] = true
						continue
					}
					if err != nil {
						b.Fatal(err)
					}
					sum[i] += d
				}
			}
			for i, m := range modes {
				if failed[i] {
					row += fmt.Sprintf(" %17s", "failed")
					continue
				}
				ms := float64(sum[i]) / float64(b.N) / 1e6
				slow := float64(sum[i]) / float64(sum[0])
				if i == 0 {
					b.ReportMetric(ms, "local-ms")
				} else {
					b.ReportMetric(slow, "slowdown-"+m.name)
				}
				row += fmt.Sprintf(" %9.1fms %5.1fx", ms, slow)
			}
			b.ReportMetric(0, "ns/op")
		})
		table.WriteString(row)
	}
	fmt.Printf("workload time on %d MiB, slowdown against all-local:\n%s\n", mib, table.String())
}

// TestSwapRunsShare: a second run uses the pool swap file the first one set
// up; the first one ends and leaves it to the second, which tears it down.
func TestSwapRunsShare(t *testing.T) {
	swapNeeds(t)
	p := swapStartPool(t, 1)
	work := swapWorkload(t)
	dir := t.TempDir()
	swapCleanup(t, dir)
	a := swapStartRun(t, append(append([]string{"run", "--mode", "swap", "--local-mem", "64MiB", "--swap-size", "1GiB", "--swap-dir", dir},
		p.args()...), "--", work, "128", "wait")...)
	a.expect(t, "written")
	b := swapStartRun(t, append(append([]string{"run", "--mode", "swap", "--local-mem", "16MiB"}, p.args()...), "--", work, "64", "wait")...)
	b.expect(t, "written")
	if s := swapStats(t, dir); s.PoolWriteBytes < 100<<20 {
		t.Errorf("both runs' overflow should be in the one swap file: %+v", s)
	}
	fmt.Fprintln(a.stdin, "go")
	fmt.Fprintln(a.stdin, "go")
	a.expect(t, "verified")
	if code := a.wait(t); code != 0 {
		t.Fatalf("first run exited %d", code)
	}
	if active, err := swaprun.ActivePoolSwaps(); err != nil || len(active) != 1 || active[0] != filepath.Join(dir, swapfs.SwapName) {
		t.Fatalf("after the first run ended, active pool swaps %v (%v): want the one it set up, still in use", active, err)
	}
	fmt.Fprintln(b.stdin, "go")
	fmt.Fprintln(b.stdin, "go")
	b.expect(t, "verified")
	if code := b.wait(t); code != 0 {
		t.Fatalf("second run exited %d", code)
	}
	swapNoLeftovers(t, dir, b.cmd.Process.Pid)
}

// swapState reads the runs' shared state (swaprun's default runtime dir).
func swapState(t *testing.T) swaprun.State {
	t.Helper()
	b, err := os.ReadFile("/run/rmem/swaprun.json")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	st, err := swaprun.ParseState(b)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// swapDaemonOf returns the pid of the mount daemon serving dir, from the
// runs' state.
func swapDaemonOf(t *testing.T, dir string) int {
	t.Helper()
	for _, s := range swapState(t).Swaps {
		if s.Dir == dir {
			return s.PID
		}
	}
	t.Fatalf("no swap of %s in the runs' state %+v", dir, swapState(t))
	return 0
}

// swapNoState checks that the runs' state lists neither dir nor the run,
// and that the daemon process is gone.
func swapNoState(t *testing.T, dir string, runPID, daemon int) {
	t.Helper()
	st := swapState(t)
	for _, s := range st.Swaps {
		if s.Dir == dir {
			t.Errorf("state entry of %s left: %+v", dir, s)
		}
	}
	for _, r := range st.Runs {
		if r.PID == runPID {
			t.Errorf("state entry of run %d left: %+v", runPID, r)
		}
	}
	if daemon != 0 && swapProcRuns(daemon) {
		t.Errorf("mount daemon %d still running", daemon)
	}
}

// swapProcRuns reports whether process pid exists and is no zombie (a
// daemon whose run was killed is reparented, and not always reaped at
// once).
func swapProcRuns(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestSwapDaemonKilled injects a kill -9 of the `memagent mount` daemon
// that `memagent run --mode swap` started, while the workload (256 MiB in
// a 64 MiB cgroup, ≥ 192 MiB of it in swap) waits between writing and
// verifying. It asserts that run exits with the workload's own status,
// 128+SIGBUS (its first swap-in fails with an I/O error and the kernel
// sends SIGBUS), says on stderr that the daemon died and what killed the
// workload, and leaves nothing: no loop device or swap area on the file,
// no mount, no cgroup, no state entry, no daemon.
func TestSwapDaemonKilled(t *testing.T) {
	swapNeeds(t)
	p := swapStartPool(t, 1)
	dir := t.TempDir()
	swapCleanup(t, dir)
	work := swapWorkload(t)
	args := append([]string{"run", "--mode", "swap", "--local-mem", "64MiB", "--swap-size", "1GiB", "--swap-dir", dir}, p.args()...)
	r := swapStartRun(t, append(args, "--", work, "256", "wait")...)
	r.expect(t, "written")
	daemon := swapDaemonOf(t, dir)
	if err := syscall.Kill(daemon, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	fmt.Fprintln(r.stdin, "go")
	code := r.wait(t)
	took := time.Since(killed)
	out := r.output()
	if want := 128 + int(syscall.SIGBUS); code != want {
		t.Errorf("run exited %d, want %d (the workload's SIGBUS)", code, want)
	}
	for _, want := range []string{
		fmt.Sprintf("the swap daemon (`memagent mount %s`, pid %d) died while the command ran (signal: killed)", dir, daemon),
		"was killed by signal 7 (SIGBUS): exit code 135",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("run's stderr lacks %q", want)
		}
	}
	if strings.Contains(out, "mount daemon: signal: killed") {
		t.Errorf("run reported the daemon's death as its own error")
	}
	swapNoLeftovers(t, dir, r.cmd.Process.Pid)
	swapNoState(t, dir, r.cmd.Process.Pid, daemon)
	survived(t, survRow{scenario: "swap daemon killed", injected: "kill -9 of memagent mount under memagent run --mode swap, 192 MiB swapped out",
		outcome: "the program's SIGBUS passed through (exit 135), no leftovers", lost: "SIGBUS", recovery: took})
	if t.Failed() {
		t.Logf("--- memagent run:\n%s", out)
	}
}

// swapKillRun starts `memagent run --mode swap` with the workload (128 MiB
// in a 64 MiB cgroup) on a swap file in dir, and kill -9s it once the
// workload has written. It checks that the workload died with it
// (PR_SET_PDEATHSIG) and that the kill left the cgroup, the swap file
// (loop device, swap area, mount, daemon) and the state entries behind,
// and returns the run's and the daemon's pids.
func swapKillRun(t *testing.T, p *swapPool, dir string) (runPID, daemon int) {
	t.Helper()
	work := swapWorkload(t)
	args := append([]string{"run", "--mode", "swap", "--local-mem", "64MiB", "--swap-size", "1GiB", "--swap-dir", dir}, p.args()...)
	r := swapStartRun(t, append(args, "--", work, "128", "wait")...)
	r.expect(t, "written")
	runPID, daemon = r.cmd.Process.Pid, swapDaemonOf(t, dir)
	_, root, _ := cgroup.Detect()
	group := filepath.Join(root, "rmem-run-"+strconv.Itoa(runPID))
	g, err := cgroup.Open(group)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := g.Procs()
	if err != nil || len(procs) != 1 {
		t.Fatalf("processes in the run's cgroup: %v %v", procs, err)
	}
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	r.cmd.Wait()
	memdtest.Eventually(t, 5*time.Second, "the workload killed with its run", func() error {
		if swapProcRuns(procs[0]) {
			return fmt.Errorf("workload %d still runs", procs[0])
		}
		return nil
	})
	// What the kill left.
	if _, err := os.Stat(group); err != nil {
		t.Errorf("the killed run's cgroup is already gone: %v", err)
	}
	if active, err := swaprun.ActivePoolSwaps(); err != nil || !slices.Contains(active, filepath.Join(dir, swapfs.SwapName)) {
		t.Errorf("the killed run's swap file is not active any more: %v %v", active, err)
	}
	if !swapProcRuns(daemon) {
		t.Errorf("the killed run's daemon %d is gone already", daemon)
	}
	if !slices.ContainsFunc(swapState(t).Runs, func(e swaprun.RunEntry) bool { return e.PID == runPID && e.Group == group }) {
		t.Errorf("the state does not list the killed run %d with its cgroup: %+v", runPID, swapState(t))
	}
	return runPID, daemon
}

// TestSwapRunKilled injects a kill -9 of `memagent run --mode swap` while
// its workload holds pages in the pool swap file the run set up. It
// asserts that the workload dies with the run, and that what the run left
// (cgroup, loop device and swap area, FUSE mount, daemon, state entries)
// is removed by `memagent cleanup`, which lists each thing it removed, and
// in the other case by the next run when it starts.
func TestSwapRunKilled(t *testing.T) {
	swapNeeds(t)
	p := swapStartPool(t, 1)
	bin := swapMemagent(t)

	t.Run("cleanup", func(t *testing.T) {
		dir := t.TempDir()
		swapCleanup(t, dir)
		runPID, daemon := swapKillRun(t, p, dir)
		start := time.Now()
		out, errOut, err := memdtest.Run(bin, nil, "cleanup")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("memagent cleanup: %v\n%s%s", err, out, errOut)
		}
		t.Logf("memagent cleanup:\n%s", out)
		for _, want := range []string{
			fmt.Sprintf("removed cgroup %s of dead run %d (0 processes killed)\n", filepath.Join(swapCgroupRoot(t), "rmem-run-"+strconv.Itoa(runPID)), runPID),
			fmt.Sprintf("removed swap %s (/dev/loop", dir),
			fmt.Sprintf("swapped off and detached, unmounted, daemon %d ended)\n", daemon),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("memagent cleanup's output lacks %q", want)
			}
		}
		swapNoLeftovers(t, dir, runPID)
		swapNoState(t, dir, runPID, daemon)
		survived(t, survRow{scenario: "swap run killed, cleanup", injected: "kill -9 of memagent run --mode swap, then memagent cleanup",
			outcome: "program died with it; cleanup removed cgroup, loop swap, mount, daemon, state", lost: "- (died with it)", recovery: took})
		if out, _, err := memdtest.Run(bin, nil, "cleanup"); err != nil || out != "nothing to clean up\n" {
			t.Errorf("a second memagent cleanup: %v: %q", err, out)
		}
	})

	t.Run("next run", func(t *testing.T) {
		dir, next := t.TempDir(), t.TempDir()
		swapCleanup(t, dir)
		swapCleanup(t, next)
		runPID, daemon := swapKillRun(t, p, dir)
		args := append([]string{"run", "--mode", "swap", "--local-mem", "16MiB", "--swap-size", "64MiB", "--swap-dir", next}, p.args()...)
		start := time.Now()
		r := swapStartRun(t, append(args, "--", "true")...)
		code := r.wait(t)
		took := time.Since(start)
		if code != 0 {
			t.Fatalf("the next run exited %d", code)
		}
		if want := fmt.Sprintf("memagent run: removed what dead runs left: cgroup %s of dead run %d", filepath.Join(swapCgroupRoot(t), "rmem-run-"+strconv.Itoa(runPID)), runPID); !strings.Contains(r.output(), want) ||
			!strings.Contains(r.output(), fmt.Sprintf("; swap %s (/dev/loop", dir)) {
			t.Errorf("the next run did not say what it removed:\n%s", r.output())
		}
		swapNoLeftovers(t, dir, runPID)
		swapNoState(t, dir, runPID, daemon)
		swapNoLeftovers(t, next, r.cmd.Process.Pid)
		swapNoState(t, next, r.cmd.Process.Pid, 0)
		survived(t, survRow{scenario: "swap run killed, next run", injected: "kill -9 of memagent run --mode swap, then another run",
			outcome: "program died with it; the next run removed what it left and ran", lost: "- (died with it)", recovery: took})
	})
}

func swapCgroupRoot(t *testing.T) string {
	_, root, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
