package apps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"rmem/internal/agentd"
	"rmem/pager"
	"rmem/pager/proto"
	"rmem/tests/internal/memdtest"
)

const (
	token    = "apps-test-token-0123456789abcdef"
	budget   = 32 << 20 // every program's --local-mem: at most 1/4 of its data
	slabSize = 64 << 20 // memd's default
	runLimit = 5 * time.Minute
	// unpagedAllowance bounds what a program holds that is not paged on
	// top of what it holds with no data (its code, libraries and stacks,
	// measured by its baseline): the shim's staging area (1 MiB), its
	// helper's stack, glibc's arena for the shim's own allocations.
	unpagedAllowance = 4 << 20
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error

	raceOnce   sync.Once
	raceBinDir string
	raceErr    error
)

// needs skips unless the tests can run here: root, userfaultfd, make, and
// each of tools (with the Debian package that has it).
func needs(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real programs under memd and memagent")
	}
	if os.Geteuid() != 0 {
		t.Skip("memagent serves other processes' userfaultfds and memd mlocks donated memory: needs root")
	}
	if _, err := os.Stat("/dev/userfaultfd"); err != nil {
		t.Skip("no /dev/userfaultfd in this kernel")
	}
	for _, tool := range append([]string{"make", "gcc"}, tools...) {
		name, pkg, _ := strings.Cut(tool, "=")
		if _, err := exec.LookPath(name); err != nil {
			if pkg == "" {
				pkg = name
			}
			t.Skipf("%s is not installed (Debian package %s; .ci/run installs it)", name, pkg)
		}
	}
}

// build runs `make build` once into a temp dir: memd, memagent and the shim
// beside them, as a user gets them.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "apps-bin-")
		if buildErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("make", "build", "BIN="+binDir)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// buildRace builds memd and memagent with the race detector (and the shim
// beside them) once, into a temp dir: an agent that reports its data races
// on stderr (checkNoRace).
func buildRace(t *testing.T) string {
	t.Helper()
	bin := build(t)
	raceOnce.Do(func() {
		raceBinDir, raceErr = os.MkdirTemp("", "apps-race-bin-")
		if raceErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-race", "-o", raceBinDir+"/", "./cmd/memd", "./cmd/memagent")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			raceErr = fmt.Errorf("go build -race: %v\n%s", err, out)
			return
		}
		shim, err := os.ReadFile(filepath.Join(bin, "librmem.so"))
		if err == nil {
			err = os.WriteFile(filepath.Join(raceBinDir, "librmem.so"), shim, 0o755)
		}
		raceErr = err
	})
	if raceErr != nil {
		t.Fatal(raceErr)
	}
	return raceBinDir
}

// checkNoRace fails t if the agent's output reports a data race.
func (e *env) checkNoRace(t *testing.T) {
	t.Helper()
	if out := e.agent.Output(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Errorf("the agent (built with -race) reports a data race:\n%s", out)
	}
}

// env is a pool (one memd with both roles, 2 GiB) and a `memagent serve`
// over it, on this host.
type env struct {
	bin, url, socket, admin, dir string
	agent                        *memdtest.Proc
}

func newEnv(t *testing.T) *env { return newEnvWith(t, "--capacity", "2GiB") }

// newEnvWith starts the pool's memd with memdArgs added.
func newEnvWith(t *testing.T, memdArgs ...string) *env { return newEnvAgent(t, memdArgs, nil) }

// newEnvAgent starts the pool's memd with memdArgs added, and memagent
// serve with agentArgs added (a --local-mem there is the agent's budget).
func newEnvAgent(t *testing.T, memdArgs, agentArgs []string) *env {
	t.Helper()
	return newEnvFrom(t, build(t), memdArgs, agentArgs)
}

// newRaceEnv is newEnv with the daemons built with the race detector.
func newRaceEnv(t *testing.T) *env {
	t.Helper()
	return newEnvFrom(t, buildRace(t), []string{"--capacity", "2GiB"}, nil)
}

// newEnvFrom is newEnvAgent with the binaries in bin.
func newEnvFrom(t *testing.T, bin string, memdArgs, agentArgs []string) *env {
	t.Helper()
	dir, err := os.MkdirTemp("", "apps-") // short: socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	addr := memdtest.FreeAddr(t)
	e := &env{bin: bin, url: "http://" + addr, socket: filepath.Join(dir, "agent.sock"), admin: filepath.Join(dir, "admin.sock"), dir: dir}
	memdtest.Start(t, "memd", filepath.Join(bin, "memd"), append([]string{"serve", "--id", "m1", "--listen", addr, "--token", token,
		"--tcp-listen", "127.0.0.1:0", "--shm-socket", "off", "--heartbeat-interval", "200ms",
		"--data-dir", filepath.Join(dir, "data"), "--runtime-dir", filepath.Join(dir, "run")}, memdArgs...)...)
	memdtest.Eventually(t, 30*time.Second, "memd up", func() error {
		_, _, err := memdtest.Run(filepath.Join(bin, "memd"), nil, "status", "--coordinator", e.url, "--token", token)
		return err
	})
	e.agent = memdtest.Start(t, "memagent serve", filepath.Join(bin, "memagent"), append([]string{"serve", "--coordinator", e.url, "--token", token,
		"--socket", e.socket, "--admin-socket", e.admin, "--local-mem", strconv.Itoa(budget)}, agentArgs...)...)
	memdtest.Eventually(t, 30*time.Second, "memagent serve answering", func() error {
		if e.agent.Exited() {
			t.Fatalf("memagent serve exited:\n%s", e.agent.Output())
		}
		_, err := e.stats()
		return err
	})
	return e
}

// addServer adds a memory server donating capacity to the pool.
func (e *env) addServer(t *testing.T, id string, args ...string) *memdtest.Proc {
	t.Helper()
	return memdtest.Start(t, "memd "+id, filepath.Join(e.bin, "memd"), append([]string{"serve", "--role", "server", "--id", id, "--coordinator", e.url,
		"--token", token, "--listen", memdtest.FreeAddr(t), "--tcp-listen", "127.0.0.1:0", "--shm-socket", "off",
		"--heartbeat-interval", "200ms", "--runtime-dir", filepath.Join(e.dir, "run-"+id)}, args...)...)
}

func (e *env) stats() (agentd.StatsResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return agentd.FetchStats(ctx, e.admin)
}

// wrap returns argv run under `memagent run` at the budget, served by the
// env's agent.
func (e *env) wrap(argv ...string) []string { return e.wrapAt(budget, argv...) }

// wrapAt is wrap at a budget of its own.
func (e *env) wrapAt(budget uint64, argv ...string) []string {
	return append([]string{filepath.Join(e.bin, "memagent"), "run", "--socket", e.socket, "--admin-socket", e.admin,
		"--local-mem", strconv.FormatUint(budget, 10), "--stats", "--"}, argv...)
}

// sample is the agent's state at one moment.
type sample struct {
	remote, resident, held, used uint64
	agentRSS                     uint64
}

// sampler watches the agent while a program runs: the sample where its
// clients' remote bytes peak (where pool space must follow them), and the
// agent's own peak resident memory.
type sampler struct {
	e      *env
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	peak   sample
	agentM uint64
	ring   uint64 // the most ring faults seen at once
	n      int
}

func (e *env) watch() *sampler {
	s := &sampler{e: e, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			s.take()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) take() {
	st, err := s.e.stats()
	if err != nil {
		return
	}
	var cur sample
	var ring uint64
	for _, c := range st.Clients {
		cur.remote += c.RemoteBytes
		cur.resident += c.ResidentBytes
		ring += c.RingFaults
	}
	cur.held, cur.used = st.Pool.HeldBytes, st.Pool.UsedBytes
	rss := procStatus(s.e.agent.Pid(), "VmRSS")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.agentM = max(s.agentM, rss)
	s.ring = max(s.ring, ring)
	if cur.remote >= s.peak.remote {
		s.peak = cur
	}
}

func (s *sampler) end() (peak sample, agentRSS uint64) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.agentM
}

// ringMode reports whether the suite runs in ring mode (RMEM_IN_THREAD=1
// in its environment, as make test-ring runs it: every program with the
// shim takes its faults in its own threads, through the fault ring).
func ringMode() bool { return os.Getenv(proto.EnvInThread) == "1" }

// skipSharedInRing skips a test of shared memory in ring mode. A ring
// client's segments are released, not paged (docs/pager.md, What keeps
// ring mode opt-in), and make test runs the ring-mode suite beside the
// race run of the same suite: these tests measure the node (its shared
// memory, PostgreSQL's processes), and each run's segments showed in the
// other's figures (CI: "shared memory +-1216 MiB" in a plain run).
func skipSharedInRing(t *testing.T) {
	t.Helper()
	if ringMode() {
		t.Skip("ring mode: shared memory is not paged there, and its node-wide figures would count the race run's beside it")
	}
}

// checkRing fails t when the suite runs in ring mode and the sampler saw no
// fault served through the ring: the program ran in the kernel's path
// after all. A traced program (no shim: a static binary, a Go program) has
// no ring; memagent run pages it from outside in either mode.
func (s *sampler) checkRing(t *testing.T, name string, traced bool) {
	t.Helper()
	if !ringMode() || traced {
		return
	}
	s.mu.Lock()
	n := s.ring
	s.mu.Unlock()
	if n == 0 {
		t.Errorf("%s: %s=1, but no fault went through the fault ring", name, proto.EnvInThread)
	}
	t.Logf("%s: %d faults through the fault ring", name, n)
}

// procStatus reads a "kB" field of /proc/PID/status in bytes (0 if gone).
func procStatus(pid int, field string) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// outcome is how a run of a program ended.
type outcome struct {
	out    string // what the test compares: the program's output or the client's view
	code   int
	hwm    uint64 // peak resident bytes of the program
	stderr string
}

// runBatch runs argv to completion with stdin, plain or under wrap, and
// measures its peak resident memory (rusage of the direct child, or what
// memagent run --stats reports for its own).
func runBatch(t *testing.T, argv []string, stdin string, extraEnv ...string) outcome {
	t.Helper()
	oc, err := runBatchE(argv, stdin, extraEnv...)
	if err != nil {
		t.Fatal(err)
	}
	return oc
}

// runBatchE is runBatch for any goroutine: it returns the failure.
func runBatchE(argv []string, stdin string, extraEnv ...string) (outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var o, e bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &o, &e
	cmd.Env = append(os.Environ(), extraEnv...)
	// A hang fails the test, not the suite: the whole process group
	// (memagent run and the program) is killed at the limit.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return outcome{}, fmt.Errorf("%s: %v", strings.Join(argv, " "), err)
	}
	if ctx.Err() != nil {
		return outcome{}, fmt.Errorf("%s: killed after %v\nstderr: %s", strings.Join(argv, " "), runLimit, tail(e.String()))
	}
	oc := outcome{out: o.String(), code: cmd.ProcessState.ExitCode(), stderr: e.String()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		oc.hwm = uint64(ru.Maxrss) << 10
	}
	if h, ok := statsHWM(e.String()); ok {
		oc.hwm = h // under memagent run: the program's, not memagent's
	}
	return oc, nil
}

// statsHWM reads "program: peak resident NMiB" from memagent run --stats.
func statsHWM(stderr string) (uint64, bool) {
	i := strings.LastIndex(stderr, "program: peak resident ")
	if i < 0 {
		return 0, false
	}
	var mib float64
	if _, err := fmt.Sscanf(stderr[i:], "program: peak resident %fMiB", &mib); err != nil {
		return 0, false
	}
	return uint64(mib * (1 << 20)), true
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

// compare checks an rmem run against the plain one: identical output and
// exit status, peak resident within the budget plus the margin over the
// program's baseline (what it holds with no data), and, at the peak of its
// paging, pool space held <= 1.1x its remote bytes plus one slab. It
// returns a line for the suite's table. budget is the run's --local-mem,
// at most 1/factor of the plain run's peak.
func compare(t *testing.T, name string, budget, factor uint64, plain, rm outcome, baseline uint64, peak sample, agentRSS uint64) {
	t.Helper()
	if rm.out != plain.out || rm.code != plain.code {
		t.Errorf("%s under memagent: exit %d, output\n%s\nplain: exit %d, output\n%s\nstderr under memagent:\n%s",
			name, rm.code, tail(rm.out), plain.code, tail(plain.out), tail(rm.stderr))
	}
	limit := budget + pager.BudgetMargin + baseline + unpagedAllowance
	if rm.hwm == 0 || rm.hwm > uint64(limit) {
		t.Errorf("%s: peak resident %s under a %s budget (limit %s: budget + %s margin + its %s baseline + %s unpaged); plain run %s",
			name, mib(rm.hwm), mib(budget), mib(uint64(limit)), mib(pager.BudgetMargin), mib(baseline), mib(unpagedAllowance), mib(plain.hwm))
	}
	// At most 1/4 of the data local (1/2 for the programs that say why:
	// batch.half).
	if plain.hwm < factor*budget {
		t.Errorf("%s: the plain run peaked at %s, less than %dx the %s budget: not a test of paging", name, mib(plain.hwm), factor, mib(budget))
	}
	if peak.remote == 0 {
		t.Errorf("%s: no remote bytes seen while it ran: nothing was paged", name)
	} else if float64(peak.held) > 1.1*float64(peak.remote)+slabSize {
		t.Errorf("%s: at its peak the pool held %s for %s of remote pages (more than 1.1x + one %s slab)", name, mib(peak.held), mib(peak.remote), mib(slabSize))
	}
	if lim := 32<<20 + budget/50; agentRSS > uint64(lim) {
		t.Errorf("%s: memagent serve peaked at %s resident while paging it (limit 32 MiB + 2%% of the budget: %s)", name, mib(agentRSS), mib(uint64(lim)))
	}
	t.Logf("| %s | %s | %s | %s | %s | %s | %.2f | %s |", name, mib(plain.hwm), mib(rm.hwm), mib(baseline),
		mib(peak.remote), mib(peak.held), float64(peak.held)/float64(max(peak.remote, 1)), mib(agentRSS))
}

func mib(b uint64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
