package tests

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"rmem/internal/agentd"
	"rmem/pager"
	"rmem/pager/proto"
	"rmem/preload/shimtest"
	"rmem/tests/internal/memdtest"
)

// The memagent tests run `memagent run` end to end, the way a user does:
// real memd processes on loopback, the agent paging real programs (C
// programs from testdata/memagent, python3) through the LD_PRELOAD shim
// and userfaultfd. Each program allocates 4x its --local-mem, so most of
// its pages go to the pool and come back; it checks every word itself and
// prints a checksum the test computes independently.

const (
	maLocalMem = "16MiB"
	maHeapMiB  = 64 // 4x maLocalMem
	maPages    = maHeapMiB << 8
	maRunLimit = 90 * time.Second // per memagent run; a hang fails, it does not stall the suite
)

// maNeeds skips unless the end-to-end memagent tests can run here.
func maNeeds(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts memd and memagent processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("memagent serves other processes' userfaultfds and mlocks donated memory: needs root")
	}
	if _, err := os.Stat("/dev/userfaultfd"); err != nil {
		if _, err := os.Stat("/proc/sys/vm/unprivileged_userfaultfd"); err != nil {
			t.Skip("no userfaultfd in this kernel")
		}
	}
	for _, tool := range []string{"gcc", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
}

var (
	maBuildOnce sync.Once
	maBinDir    string
	maBuildErr  error
)

// maRaceBuilt reports whether this test binary has the race detector, so
// that memagent is built with it too.
func maRaceBuilt() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// maBuild builds, once per test binary, memagent with the shim beside it
// (where `memagent run` looks for it, as `make build` installs it) and the
// test programs of testdata/memagent, and returns their directory.
func maBuild(t *testing.T) string {
	t.Helper()
	maBuildOnce.Do(func() {
		maBinDir, maBuildErr = os.MkdirTemp("", "memagent-bin-")
		if maBuildErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..")
		args := []string{"build", "-o", filepath.Join(maBinDir, "memagent")}
		if maRaceBuilt() {
			args = append(args, "-race")
		}
		steps := [][]string{
			append(append([]string{"go"}, args...), "./cmd/memagent"),
			{"preload/build.sh", filepath.Join(maBinDir, "librmem.so")}, // the shim as make builds it
		}
		for _, prog := range []string{"pattern", "fork", "threads", "hotcold", "bigio"} {
			steps = append(steps, []string{"gcc", "-O2", "-pthread", "-Wall", "-Wextra", "-Werror",
				"-o", filepath.Join(maBinDir, prog), filepath.Join("tests", "testdata", "memagent", prog+".c")})
		}
		for _, s := range steps {
			cmd := exec.Command(s[0], s[1:]...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				maBuildErr = fmt.Errorf("%s: %v\n%s", strings.Join(s, " "), err, out)
				return
			}
		}
	})
	if maBuildErr != nil {
		t.Fatal(maBuildErr)
	}
	return maBinDir
}

// maPool is a pool on loopback: memd "m1" with both roles, and memory
// servers "m2", "m3"... with --role server.
type maPool struct {
	url     string
	memd    string
	servers map[string]*memdtest.Proc
}

func maStartPool(t *testing.T, n int) *maPool {
	t.Helper()
	bin := memdtest.Build(t)
	dir := t.TempDir()
	addr := memdtest.FreeAddr(t)
	p := &maPool{url: "http://" + addr, memd: bin, servers: map[string]*memdtest.Proc{}}
	common := []string{"--token", memdToken, "--tcp-listen", "127.0.0.1:0", "--shm-socket", "off",
		"--capacity", "256MiB", "--slab-size", "16MiB", "--heartbeat-interval", "200ms", memdtest.MlockFlag(t, 256<<20)}
	p.servers["m1"] = memdtest.Start(t, "m1", bin, append([]string{"serve", "--id", "m1", "--listen", addr,
		"--data-dir", filepath.Join(dir, "data"), "--runtime-dir", filepath.Join(dir, "run-m1"),
		"--heartbeat-timeout", "1s", "--sweep-interval", "100ms"}, common...)...)
	for i := 2; i <= n; i++ {
		id := fmt.Sprintf("m%d", i)
		p.servers[id] = memdtest.Start(t, id, bin, append([]string{"serve", "--role", "server", "--id", id,
			"--coordinator", p.url, "--listen", memdtest.FreeAddr(t), "--runtime-dir", filepath.Join(dir, "run-"+id),
			"--heartbeat-timeout", "1s"}, common...)...)
	}
	memdtest.Eventually(t, 30*time.Second, fmt.Sprintf("%d memory servers up", n), func() error {
		for id, s := range p.servers {
			if s.Exited() {
				t.Fatalf("memd %s exited:\n%s", id, s.Output())
			}
		}
		out, _, err := memdtest.Run(bin, nil, "servers", "--json", "--coordinator", p.url, "--token", memdToken)
		if err != nil {
			return err
		}
		if up := strings.Count(out, `"state": "up"`); up != n {
			return fmt.Errorf("%d up", up)
		}
		return nil
	})
	return p
}

// args are the flags that point memagent at this pool.
func (p *maPool) args() []string { return []string{"--coordinator", p.url, "--token", memdToken} }

// maResult is how a memagent process ended.
type maResult struct {
	stdout, stderr string
	code           int
	elapsed        time.Duration
}

// maExec runs bin with args and extra environment, in its own process
// group, stdin closed, for at most maRunLimit (then the whole group is
// killed and the test fails).
func maExec(t *testing.T, env []string, bin string, args ...string) maResult {
	t.Helper()
	return maExecAs(t, nil, env, bin, args...)
}

// maExecAs is maExec as another user (cred nil: ours).
func maExecAs(t *testing.T, cred *syscall.Credential, env []string, bin string, args ...string) maResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(maRunLimit, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err := cmd.Wait()
	elapsed := time.Since(start)
	if !timer.Stop() {
		t.Fatalf("%s %s: killed after %v\nstdout: %s\nstderr: %s", bin, strings.Join(args, " "), maRunLimit, o.String(), e.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	r := maResult{stdout: o.String(), stderr: e.String(), code: cmd.ProcessState.ExitCode(), elapsed: elapsed}
	if strings.Contains(r.stderr, "DATA RACE") {
		t.Errorf("the race detector found a data race in %s:\n%s", bin, r.stderr)
	}
	return r
}

// maAgent is a `memagent serve` with its sockets in a short temp dir.
type maAgent struct {
	bin, socket, admin string
	proc               *memdtest.Proc
}

func maServe(t *testing.T, bin string, p *maPool, extra ...string) *maAgent {
	t.Helper()
	return maServeIn(t, maAgentDir(t), bin, p, extra...)
}

// maAgentDir is a short temp dir for an agent's sockets (their paths are
// limited to 108 bytes), removed at the end of the test.
func maAgentDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ma-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // the socket's own mode says who may connect
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// maServeIn starts `memagent serve` with its sockets (and so its state
// dir) in dir: an agent started again in the same dir takes over from one
// that died there.
func maServeIn(t *testing.T, dir, bin string, p *maPool, extra ...string) *maAgent {
	t.Helper()
	a := &maAgent{bin: bin, socket: filepath.Join(dir, "agent.sock"), admin: filepath.Join(dir, "admin.sock")}
	args := append([]string{"serve", "--socket", a.socket, "--admin-socket", a.admin, "--local-mem", maLocalMem}, p.args()...)
	a.proc = memdtest.Start(t, "memagent serve", bin, append(args, extra...)...)
	memdtest.Eventually(t, 30*time.Second, "memagent serve answering", func() error {
		if a.proc.Exited() {
			t.Fatalf("memagent serve exited:\n%s", a.proc.Output())
		}
		_, err := a.stats(t)
		return err
	})
	return a
}

func (a *maAgent) stats(t *testing.T) (agentd.StatsResponse, error) {
	var st agentd.StatsResponse
	out, errOut, err := memdtest.Run(a.bin, nil, "stats", "--json", "--admin-socket", a.admin)
	if err != nil {
		return st, fmt.Errorf("memagent stats: %v: %s", err, errOut)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("memagent stats --json: %v: %q", err, out)
	}
	return st, nil
}

// run runs CMD under `memagent run` served by this agent and returns how
// it ended and the final stats of the processes it started (the agent's
// exited clients that were not there before).
func (a *maAgent) run(t *testing.T, cmd ...string) (maResult, []pager.ClientStats) {
	t.Helper()
	return a.runAs(t, nil, cmd...)
}

// runAs is run as another user (cred nil: ours).
func (a *maAgent) runAs(t *testing.T, cred *syscall.Credential, cmd ...string) (maResult, []pager.ClientStats) {
	t.Helper()
	before, err := a.stats(t)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for _, s := range before.Exited {
		seen[s.ID] = true
	}
	r := maExecAs(t, cred, nil, a.bin, append([]string{"run", "--socket", a.socket, "--log-level", "warn", "--"}, cmd...)...)
	var rows []pager.ClientStats
	memdtest.Eventually(t, 10*time.Second, "the agent sees the program exit", func() error {
		st, err := a.stats(t)
		if err != nil {
			return err
		}
		if len(st.Clients) > 0 {
			return fmt.Errorf("%d clients still live", len(st.Clients))
		}
		rows = rows[:0]
		for _, s := range st.Exited {
			if !seen[s.ID] {
				rows = append(rows, s)
			}
		}
		return nil
	})
	return r, rows
}

// maPat is the pattern of the C programs: word i holds pat(i).
func maPat(i uint64) uint64 { return i*0x9E3779B97F4A7C15 + 1 }

// maSum is the checksum the C programs print for words [0, n) holding
// pat(i+base): the sum of word*(i|1) mod 2^64.
func maSum(n, base uint64) uint64 {
	var s uint64
	for i := range n {
		s += maPat(i+base) * (i | 1)
	}
	return s
}

// maCheckPaged fails unless the stats show pages that went to the pool and
// came back, and none lost.
func maCheckPaged(t *testing.T, s pager.ClientStats) {
	t.Helper()
	t.Logf("pid %d: faults %d (zero fills %d, remote reads %d, wp %d, held %d), p50 %v p99 %v install p50 %v, evictions %d, write-backs %d, prefetch %d issued %d hits, lost %d",
		s.PID, s.Faults, s.ZeroFills, s.RemoteReads, s.WPFaults, s.Held, s.FaultP50, s.FaultP99, s.InstallP50,
		s.Evictions, s.WriteBacks, s.PrefetchIssued, s.PrefetchHits, s.Lost)
	if s.Evictions == 0 || s.WriteBacks == 0 || s.RemoteReads == 0 || s.Lost != 0 {
		t.Errorf("pid %d: evictions %d, write-backs %d, remote reads %d, lost %d: want pages evicted, written back and read back, none lost",
			s.PID, s.Evictions, s.WriteBacks, s.RemoteReads, s.Lost)
	}
	// More pages read than prefetched: some were read for a waiting
	// thread, and their installs are timed.
	if s.RemoteReads > s.PrefetchIssued && s.InstallP50 == 0 {
		t.Errorf("pid %d: %d remote reads (%d prefetched) but no install p50", s.PID, s.RemoteReads, s.PrefetchIssued)
	}
}

// maOneClient returns the only row, or fails.
func maOneClient(t *testing.T, rows []pager.ClientStats) pager.ClientStats {
	t.Helper()
	if len(rows) != 1 {
		t.Fatalf("stats of %d processes, want 1: %+v", len(rows), rows)
	}
	return rows[0]
}

func maCheckExit(t *testing.T, r maResult, wantStdout string) {
	t.Helper()
	if r.code != 0 || r.stdout != wantStdout {
		t.Fatalf("exit %d, stdout %q, want 0 and %q\nstderr: %s", r.code, r.stdout, wantStdout, r.stderr)
	}
}

// maPythonProgram fills a bytearray of MIB mebibytes page by page (page k
// is a rotation of a fixed 4 KiB block, starting with k), then reads the
// pages back in a permuted order, checks them and prints a checksum: the
// sum of crc32(page k) * (k+1) mod 2^64.
const maPythonProgram = `
import hashlib, sys, zlib
pages = int(sys.argv[1]) << 8
base = b''.join(hashlib.sha256(i.to_bytes(4, 'little')).digest() for i in range(128))
def page(k):
    r = (k * 7) % 4096
    return k.to_bytes(8, 'little') + (base[r:] + base[:r])[8:]
buf = bytearray(pages * 4096)
for k in range(pages):
    buf[k * 4096:(k + 1) * 4096] = page(k)
print("written", pages, "pages", flush=True)
stride = pages // 2 + pages // 8 + 1
s = 0
for j in range(pages):
    k = j * stride % pages
    got = bytes(buf[k * 4096:(k + 1) * 4096])
    if got != page(k):
        print("page", k, "is wrong", file=sys.stderr)
        sys.exit(1)
    s = (s + zlib.crc32(got) * (k + 1)) % (1 << 64)
print("checksum %016x" % s)
`

// maPythonSum is the checksum maPythonProgram prints.
func maPythonSum(pages int) uint64 {
	var base []byte
	for i := range 128 {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(i))
		d := sha256.Sum256(b[:])
		base = append(base, d[:]...)
	}
	var s uint64
	pg := make([]byte, 4096)
	for k := range pages {
		r := (k * 7) % 4096
		copy(pg, base[r:])
		copy(pg[4096-r:], base[:r])
		binary.LittleEndian.PutUint64(pg, uint64(k))
		s += uint64(crc32.ChecksumIEEE(pg)) * uint64(k+1)
	}
	return s
}

// TestMemagentRun: programs using 4x their --local-mem get their exact
// results under `memagent run`, with their pages paged out and back; the
// exit status and stdout of CMD pass through.
func TestMemagentRun(t *testing.T) {
	maNeeds(t)
	bins := maBuild(t)
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 1)
	a := maServe(t, memagent, p)

	t.Run("C", func(t *testing.T) {
		r, rows := a.run(t, filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		t.Logf("C program, %d MiB heap under %s local: %v", maHeapMiB, maLocalMem, r.elapsed)
		maCheckPaged(t, maOneClient(t, rows))
	})

	// --stats with an agent already running reads its admin socket.
	t.Run("stats", func(t *testing.T) {
		r := maExec(t, nil, memagent, "run", "--socket", a.socket, "--admin-socket", a.admin, "--stats", "--log-level", "warn",
			"--", filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		rows := maTableRows(t, r.stderr)
		if len(rows) != 1 || rows[0].evictions == 0 || rows[0].writeBacks == 0 || rows[0].lost != 0 {
			t.Errorf("--stats: %+v: want one row with evictions and write-backs, none lost\n%s", rows, r.stderr)
		}
	})

	// --local-mem with an agent already running: CMD asks it for that
	// budget in its HELLO (the agent's own is maLocalMem).
	t.Run("own budget", func(t *testing.T) {
		r := maExec(t, nil, memagent, "run", "--socket", a.socket, "--admin-socket", a.admin, "--stats", "--log-level", "warn",
			"--local-mem", "8MiB", "--", filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		rows := maTableRows(t, r.stderr)
		if len(rows) != 1 || rows[0].budget != "8.0MiB" || rows[0].evictions == 0 || rows[0].lost != 0 {
			t.Errorf("--local-mem 8MiB: %+v: want one row with an 8.0MiB budget and evictions, none lost\n%s", rows, r.stderr)
		}
	})

	// Buffers the budget cannot hold, in ring mode (the faulting
	// threads serve their misses): each system call's buffers are made
	// present and pinned first, and a call of 64 MiB under 16 MiB must
	// neither hang on evictions its pins refuse nor fail
	// (testdata/memagent/bigio.c).
	t.Run("big buffers", func(t *testing.T) {
		r := maExec(t, nil, memagent, "run", "--socket", a.socket, "--in-thread", "--log-level", "warn",
			"--", filepath.Join(bins, "bigio"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, "bigio ok\n")
		t.Logf("bigio, %d MiB buffers under %s local: %v", maHeapMiB, maLocalMem, r.elapsed)
	})

	t.Run("python3", func(t *testing.T) {
		// Debian's python3, not a wrapper first in PATH (pyenv's shim
		// script runs bash and pyenv first, each a client of its own).
		py := "/usr/bin/python3"
		if _, err := os.Stat(py); err != nil {
			t.Skip("python3 not installed (/usr/bin/python3)")
		}
		script := filepath.Join(t.TempDir(), "pattern.py")
		if err := os.WriteFile(script, []byte(maPythonProgram), 0o644); err != nil {
			t.Fatal(err)
		}
		r, rows := a.run(t, py, script, strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maPythonSum(maPages)))
		t.Logf("python3, %d MiB bytearray under %s local: %v", maHeapMiB, maLocalMem, r.elapsed)
		maCheckPaged(t, maOneClient(t, rows))
	})

	t.Run("fork", func(t *testing.T) {
		r, rows := a.run(t, filepath.Join(bins, "fork"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, "child ok\nparent ok\n")
		t.Logf("fork, %d MiB heap under %s local: %v", maHeapMiB, maLocalMem, r.elapsed)
		if len(rows) != 2 {
			t.Fatalf("stats of %d processes, want the parent and the child: %+v", len(rows), rows)
		}
		for _, s := range rows {
			maCheckPaged(t, s)
		}
	})

	t.Run("threads", func(t *testing.T) {
		const threads = 8
		r, rows := a.run(t, filepath.Join(bins, "threads"), strconv.Itoa(maHeapMiB), strconv.Itoa(threads))
		shared := uint64(maHeapMiB<<20) / 2 / 8
		own := shared / threads
		want := threads * maSum(shared, 0)
		for i := range uint64(threads) {
			want += maSum(own, (i+1)<<40)
		}
		maCheckExit(t, r, fmt.Sprintf("checksum %016x\n", want))
		t.Logf("%d threads, %d MiB under %s local: %v", threads, maHeapMiB, maLocalMem, r.elapsed)
		maCheckPaged(t, maOneClient(t, rows))
	})

	t.Run("exit status and stdout", func(t *testing.T) {
		for _, tc := range []struct {
			script string
			code   int
			stdout string
		}{
			{"exit 0", 0, ""},
			{"exit 3", 3, ""},
			{"kill -TERM $$", 128 + int(syscall.SIGTERM), ""},
			{"kill -KILL $$", 128 + int(syscall.SIGKILL), ""},
			{`printf 'no newline\000\001\377'; exit 7`, 7, "no newline\x00\x01\xff"},
		} {
			r := maExec(t, nil, memagent, "run", "--socket", a.socket, "--log-level", "warn", "--", "sh", "-c", tc.script)
			if r.code != tc.code || r.stdout != tc.stdout {
				t.Errorf("run -- sh -c %q: exit %d, stdout %q; want %d, %q\nstderr: %s", tc.script, r.code, r.stdout, tc.code, tc.stdout, r.stderr)
			}
		}
	})

	// SIGTERM to memagent reaches CMD, and CMD's death by it is memagent's
	// exit status.
	t.Run("SIGTERM forwarded", func(t *testing.T) {
		cmd := exec.Command(memagent, "run", "--socket", a.socket, "--log-level", "warn", "--", "sh", "-c", "echo ready; exec sleep 60")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			t.Fatalf("first line %q: %v", line, err)
		}
		start := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		timer := time.AfterFunc(maRunLimit, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		defer timer.Stop()
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) || time.Since(start) >= maRunLimit {
			t.Errorf("memagent run after SIGTERM: exit %d after %v, want %d", code, time.Since(start), 128+int(syscall.SIGTERM))
		}
	})
}

// TestMemagentRunPrivateAgent: with no agent listening, `memagent run`
// starts one for the duration, and --stats prints the program's figures.
// Programs of an ordinary user, paged by the node's agent (root) that
// --allow-user lets them in: the kernel gives such a process no
// userfaultfd (vm.unprivileged_userfaultfd 0, /dev/userfaultfd root's) and
// no FORK events (CAP_SYS_PTRACE): the shim borrows /dev/userfaultfd from
// the agent and forks through FORK_PREPARE.
func TestMemagentRunOtherUser(t *testing.T) {
	maNeeds(t)
	uid, gid := shimtest.Nobody(t)
	cred := &syscall.Credential{Uid: uid, Gid: gid}
	bins := maBuild(t)
	if err := os.Chmod(bins, 0o755); err != nil {
		t.Fatal(err)
	}
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 1)
	a := maServe(t, memagent, p, "--allow-user", "nobody")

	t.Run("C", func(t *testing.T) {
		r, rows := a.runAs(t, cred, filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		maCheckPaged(t, maOneClient(t, rows))
	})
	t.Run("fork", func(t *testing.T) {
		r, rows := a.runAs(t, cred, filepath.Join(bins, "fork"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, "child ok\nparent ok\n")
		if len(rows) != 2 {
			t.Fatalf("stats of %d processes, want the parent and the child: %+v", len(rows), rows)
		}
		for _, s := range rows {
			maCheckPaged(t, s)
		}
	})
	// The admin socket of an agent that serves other users is open to
	// them: each sees its own programs only (root sees all).
	t.Run("stats", func(t *testing.T) {
		r := maExecAs(t, cred, nil, memagent, "run", "--socket", a.socket, "--admin-socket", a.admin, "--stats",
			"--log-level", "warn", "--", filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		rows := maTableRows(t, r.stderr)
		if len(rows) != 1 || rows[0].evictions == 0 || rows[0].lost != 0 {
			t.Fatalf("--stats as nobody: %+v: want its program's row, with evictions\n%s", rows, r.stderr)
		}
		out := maExecAs(t, cred, nil, memagent, "stats", "--json", "--all", "--admin-socket", a.admin)
		var mine agentd.StatsResponse
		if err := json.Unmarshal([]byte(out.stdout), &mine); err != nil || out.code != 0 {
			t.Fatalf("memagent stats --json as nobody: exit %d, %v\n%s%s", out.code, err, out.stdout, out.stderr)
		}
		all, err := a.stats(t)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range mine.Exited {
			if s.UID != uid {
				t.Errorf("nobody sees a process of uid %d: %+v", s.UID, s)
			}
		}
		if len(mine.Exited) == 0 || len(mine.Exited) != len(all.Exited) {
			t.Errorf("nobody sees %d exited programs, root %d; all of them are nobody's", len(mine.Exited), len(all.Exited))
		}
	})
	// An agent that serves no other user: its stats are root's.
	t.Run("stats of a root-only agent", func(t *testing.T) {
		other := maServe(t, memagent, p)
		out := maExecAs(t, cred, nil, memagent, "stats", "--admin-socket", other.admin)
		if out.code == 0 || !strings.Contains(out.stderr, "its stats need root") {
			t.Fatalf("exit %d; want an error saying the stats are root's; stderr:\n%s", out.code, out.stderr)
		}
		t.Logf("stats said: %s", strings.TrimSpace(out.stderr))
	})
	// --allow-group: the socket (0660) belongs to the group, whose
	// members are served.
	t.Run("group", func(t *testing.T) {
		g, err := user.LookupGroupId(strconv.Itoa(int(gid)))
		if err != nil {
			t.Skipf("nobody's group: %v", err)
		}
		ga := maServe(t, memagent, p, "--allow-group", g.Name)
		fi, err := os.Stat(ga.socket)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != gid {
			t.Fatalf("socket mode %v group %d, want 0660 and group %s (%d)", fi.Mode().Perm(), st.Gid, g.Name, gid)
		}
		r, rows := ga.runAs(t, cred, filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		maCheckPaged(t, maOneClient(t, rows))
	})
	// An agent that does not serve the user: its socket (0660) is closed
	// to it, and run says so rather than start an agent of its own.
	t.Run("socket closed", func(t *testing.T) {
		other := maServe(t, memagent, p)
		r := maExecAs(t, cred, nil, memagent, "run", "--socket", other.socket, "--log-level", "warn", "--",
			filepath.Join(bins, "pattern"), "8")
		if r.code == 0 || !strings.Contains(r.stderr, "does not let user nobody in") || !strings.Contains(r.stderr, "--allow-user nobody") {
			t.Fatalf("exit %d; want an error naming the way in; stderr:\n%s", r.code, r.stderr)
		}
		t.Logf("run said: %s", strings.TrimSpace(r.stderr))
	})
	// Its socket open (another user is allowed), the agent refuses the
	// HELLO: the program runs on ordinary memory and the shim says so.
	t.Run("refused", func(t *testing.T) {
		other := maServe(t, memagent, p, "--allow-user", "daemon")
		r := maExecAs(t, cred, nil, memagent, "run", "--socket", other.socket, "--log-level", "warn", "--",
			filepath.Join(bins, "pattern"), "8")
		if r.code != 0 || !strings.Contains(r.stderr, "may not use this agent") || !strings.Contains(r.stderr, "using ordinary memory") {
			t.Fatalf("exit %d; want the program to run on ordinary memory and say why; stderr:\n%s", r.code, r.stderr)
		}
		t.Logf("the shim said: %s", strings.TrimSpace(r.stderr))
	})
}

func TestMemagentRunPrivateAgent(t *testing.T) {
	maNeeds(t)
	bins := maBuild(t)
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 1)
	dir, err := os.MkdirTemp("", "ma-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	base := append([]string{"run", "--socket", filepath.Join(dir, "agent.sock"), "--local-mem", maLocalMem, "--stats", "--log-level", "error"}, p.args()...)

	t.Run("C", func(t *testing.T) {
		r := maExec(t, nil, memagent, append(base, "--", filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB))...)
		maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0)))
		rows := maTableRows(t, r.stderr)
		if len(rows) != 1 {
			t.Fatalf("--stats printed %d rows, want 1:\n%s", len(rows), r.stderr)
		}
		if rows[0].evictions == 0 || rows[0].writeBacks == 0 || rows[0].lost != 0 {
			t.Errorf("--stats: %+v: want evictions and write-backs, none lost", rows[0])
		}
		// The agent was this memagent's own: it says what CPU it took,
		// and how much of it its fault loop spent polling (--spin is on
		// by default and faults came fast).
		if !regexp.MustCompile(`(?m)^agent process: [0-9.]+s of CPU, [0-9.]+s of it polling \(.*agent-loop [0-9.]+s: [0-9]+ waits caught, [0-9]+ polls ran out`).MatchString(r.stderr) {
			t.Errorf("--stats with an agent of its own: no line of the agent's CPU and polling:\n%s", r.stderr)
		}
		t.Logf("private agent, C program: %v\n%s", r.elapsed, r.stderr)
	})

	// The child exits first: --stats must still wait for the program's
	// own row, and print both.
	t.Run("fork", func(t *testing.T) {
		r := maExec(t, nil, memagent, append(base, "--", filepath.Join(bins, "fork"), strconv.Itoa(maHeapMiB/2))...)
		maCheckExit(t, r, "child ok\nparent ok\n")
		if rows := maTableRows(t, r.stderr); len(rows) != 2 {
			t.Fatalf("--stats printed %d rows, want the parent's and the child's:\n%s", len(rows), r.stderr)
		}
		t.Logf("private agent, fork: %v\n%s", r.elapsed, r.stderr)
	})

	t.Run("exit status", func(t *testing.T) {
		r := maExec(t, nil, memagent, append(base[:len(base):len(base)], "--stats=false", "--", "sh", "-c", "printf out; exit 3")...)
		if r.code != 3 || r.stdout != "out" {
			t.Errorf("exit %d, stdout %q; want 3, %q\nstderr: %s", r.code, r.stdout, "out", r.stderr)
		}
	})

	t.Run("no memd", func(t *testing.T) {
		nowhere := "http://" + memdtest.FreeAddr(t)
		for _, replicas := range []string{"0", "2"} {
			r := maExec(t, nil, memagent, "run", "--socket", filepath.Join(dir, "agent.sock"), "--coordinator", nowhere,
				"--token", memdToken, "--replicas", replicas, "--connect-timeout", "300ms", "--log-level", "error", "--", "sh", "-c", "echo ran")
			if r.code == 0 || r.stdout != "" || !strings.HasPrefix(r.stderr, "memagent: agentd: no coordinator reachable (is memd running? see --coordinator)") ||
				!strings.Contains(r.stderr, nowhere) || !strings.Contains(r.stderr, "connection refused") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("memagent run --replicas %s with no memd: exit %d, stdout %q, stderr %q: want a failure, one line saying no coordinator is reachable, naming it and the cause, and CMD not run",
					replicas, r.code, r.stdout, r.stderr)
			}
			t.Logf("with no memd: %s", r.stderr)
		}
	})

	// Started before memd, as two units started together are: it waits
	// for the token file memd writes and for the coordinator, says so
	// once, and runs CMD once they are there.
	t.Run("memd started after", func(t *testing.T) {
		addr, run := memdtest.FreeAddr(t), filepath.Join(dir, "late-run")
		done := make(chan maResult, 1)
		go func() {
			done <- maExec(t, nil, memagent, "run", "--socket", filepath.Join(dir, "late.sock"), "--coordinator", "http://"+addr,
				"--token-file", filepath.Join(run, "token"), "--local-mem", maLocalMem, "--", "sh", "-c", "echo ran")
		}()
		time.Sleep(2 * time.Second)
		memdtest.Start(t, "late", p.memd, "serve", "--listen", addr, "--tcp-listen", "127.0.0.1:0", "--shm-socket", "off",
			"--capacity", "64MiB", "--slab-size", "16MiB", "--data-dir", filepath.Join(dir, "late-data"), "--runtime-dir", run,
			memdtest.MlockFlag(t, 64<<20))
		r := <-done
		if r.code != 0 || r.stdout != "ran\n" {
			t.Fatalf("memagent run started 2s before memd: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
		}
		if n := strings.Count(r.stderr, "waiting for the token file"); n != 1 {
			t.Errorf("said %d times that it waits for the token file, want once:\n%s", n, r.stderr)
		}
	})
}

// TestMemagentShimNoAgent: a program with the shim and no agent reachable
// runs on ordinary memory and says so in exactly one stderr line.
func TestMemagentShimNoAgent(t *testing.T) {
	maNeeds(t)
	bins := maBuild(t)
	env := []string{"LD_PRELOAD=" + filepath.Join(bins, "librmem.so"), proto.EnvSocket + "=" + filepath.Join(t.TempDir(), "nowhere.sock")}
	r := maExec(t, env, filepath.Join(bins, "pattern"), "64")
	maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", 64<<8, maSum(64<<8*512, 0)))
	if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "no agent") {
		t.Errorf("stderr %q: want exactly one line saying there is no agent", r.stderr)
	}
}

// maRow is a row of the --stats table.
type maRow struct {
	pid, faults, evictions, writeBacks, lost int
	budget                                   string
}

// maTableRows parses the rows of memagent's stats table (cmd/memagent/table.go) in text.
func maTableRows(t *testing.T, text string) []maRow {
	t.Helper()
	var rows []maRow
	sc := bufio.NewScanner(strings.NewReader(text))
	var cols map[string]int // column name -> field index
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "PID" {
			// "PREFETCH HITS" is one column of two words.
			cols = map[string]int{}
			for i, name := range strings.Fields(strings.ReplaceAll(sc.Text(), "PREFETCH HITS", "PREFETCH-HITS")) {
				cols[name] = i
			}
			continue
		}
		if cols == nil || len(f) != len(cols) {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue // not a row: the pool line after the table, say
		}
		num := func(name string) int {
			i, ok := cols[name]
			if !ok {
				t.Fatalf("stats table has no %s column: %q", name, text)
			}
			v, err := strconv.Atoi(f[i])
			if err != nil {
				t.Fatalf("stats row %q: column %s: %v", sc.Text(), name, err)
			}
			return v
		}
		rows = append(rows, maRow{pid: num("PID"), faults: num("FAULTS"), evictions: num("EVICTIONS"),
			writeBacks: num("WRITE-BACKS"), lost: num("LOST"), budget: f[cols["BUDGET"]]})
	}
	if cols == nil {
		t.Fatalf("no stats table in %q", text)
	}
	return rows
}

// TestMemagentReplicaKill: with --replicas 2, kill -9 of the memory server
// holding primary replicas of the program's slabs while it runs: it
// finishes with the right checksum, reading from the surviving replicas.
func TestMemagentReplicaKill(t *testing.T) { maReplicaFailure(t, false) }

// TestMemagentReplicaStop: the same with SIGSTOP while the program reads
// its heap back: the server's connections stay open and it answers
// nothing, so the agent's READs to it wait out the op deadline and move
// to the surviving replicas.
func TestMemagentReplicaStop(t *testing.T) { maReplicaFailure(t, true) }

func maReplicaFailure(t *testing.T, stop bool) {
	maNeeds(t)
	bins := maBuild(t)
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 3)
	dir, err := os.MkdirTemp("", "ma-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	gate := filepath.Join(dir, "go")
	args := append([]string{"run", "--socket", filepath.Join(dir, "agent.sock"), "--local-mem", maLocalMem,
		"--replicas", "2", "--lease-ttl", "3s", "--stats", "--log-level", "warn"}, p.args()...)
	args = append(args, "--", filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB), gate)

	cmd := exec.Command(memagent, args...)
	var stdout, stderr bytes.Buffer
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var waitErr error
	done := make(chan struct{}) // closed when cmd has ended, waitErr set
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			stdout.WriteString(sc.Text() + "\n")
			lines <- sc.Text()
		}
	}()
	select {
	case l := <-lines:
		if l != fmt.Sprintf("written %d pages", maPages) {
			t.Fatalf("first line %q", l)
		}
	case <-time.After(maRunLimit):
		t.Fatalf("the program did not write its heap within %v:\n%s", maRunLimit, stderr.String())
	}

	// The memory server with the most primary replicas (the first of each
	// slab, where the agent reads first) of the program's slabs.
	slabs, err := maSlabs(p)
	if err != nil {
		t.Fatal(err)
	}
	primaries := map[string]int{}
	for _, s := range slabs {
		if len(s.Replicas) != 2 {
			t.Fatalf("slab %d has %d replicas, want 2: %+v", s.ID, len(s.Replicas), slabs)
		}
		primaries[s.Replicas[0].Server]++
	}
	// Not m1 if another will do: it is also the coordinator.
	victim := ""
	for id, n := range primaries {
		if victim == "" || victim == "m1" || (id != "m1" && n > primaries[victim]) {
			victim = id
		}
	}
	if victim == "" {
		t.Fatal("the program has no slabs")
	}
	how := "kill -9"
	if stop {
		how = "kill -STOP"
		// Stop it once the program reads its heap back.
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		p.servers[victim].Signal(syscall.SIGSTOP)
	} else {
		p.servers[victim].Kill()
	}
	t.Logf("%d slabs; primaries per server %v; %s %s", len(slabs), primaries, how, victim)
	// The agent restores redundancy from the surviving replicas (unless
	// m1, the coordinator, held every primary and is the one killed).
	if victim != "m1" {
		took := memdtest.Eventually(t, 30*time.Second, "two healthy replicas of every slab again", func() error {
			slabs, err := maSlabs(p)
			if err != nil {
				return err
			}
			for _, s := range slabs {
				ok := 0
				for _, r := range s.Replicas {
					if r.Server != victim && r.State == "ok" {
						ok++
					}
				}
				if ok < 2 {
					return fmt.Errorf("slab %d: %+v", s.ID, s.Replicas)
				}
			}
			return nil
		})
		t.Logf("redundancy restored %v after %s of %s (heartbeat timeout 1s, lease TTL 3s)", took, how, victim)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	select {
	case <-done:
		for range lines {
		}
		want := fmt.Sprintf("written %d pages\nchecksum %016x\n", maPages, maSum(maPages*512, 0))
		if err := waitErr; err != nil || stdout.String() != want {
			t.Fatalf("after %s of %s: %v, stdout %q, want %q\nstderr:\n%s", how, victim, err, stdout.String(), want, stderr.String())
		}
	case <-time.After(maRunLimit):
		t.Fatalf("the program did not finish within %v after %s of %s:\n%s", maRunLimit, how, victim, stderr.String())
	}
	rows := maTableRows(t, stderr.String())
	if len(rows) != 1 || rows[0].lost != 0 || rows[0].evictions == 0 {
		t.Errorf("--stats after %s of %s: %+v: want one row, evictions, none lost\n%s", how, victim, rows, stderr.String())
	}
	if strings.Contains(stderr.String(), "DATA RACE") {
		t.Errorf("the race detector found a data race in memagent:\n%s", stderr.String())
	}
	t.Logf("stats after %s of %s:\n%s", how, victim, stderr.String())
}

// maSlab is a slab in `memd slabs --json`.
type maSlab struct {
	ID       uint64 `json:"id"`
	Replicas []struct {
		Server string `json:"server"`
		State  string `json:"state"`
	} `json:"replicas"`
}

// maSlabs lists the pool's slabs with `memd slabs --json`.
func maSlabs(p *maPool) ([]maSlab, error) {
	out, errOut, err := memdtest.Run(p.memd, nil, "slabs", "--json", "--coordinator", p.url, "--token", memdToken)
	if err != nil {
		return nil, fmt.Errorf("memd slabs: %v: %s", err, errOut)
	}
	var slabs []maSlab
	if err := json.Unmarshal([]byte(out), &slabs); err != nil {
		return nil, fmt.Errorf("memd slabs --json: %v: %s", err, out)
	}
	return slabs, nil
}

// TestMemagentMetricsListen: memagent serve --metrics-listen serves the
// agent's metrics over TCP for a Prometheus server, the agent-wide series
// and the counters of exited programs from the start (the per-program
// ones come with the programs); memagent
// run refuses the flag when it uses that agent, and an address in use is
// a flag error.
func TestMemagentMetricsListen(t *testing.T) {
	maNeeds(t)
	bins := maBuild(t)
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 1)
	addr := memdtest.FreeAddr(t)
	a := maServe(t, memagent, p, "--metrics-listen", addr)
	scrape := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
		}
		return string(body)
	}
	defer http.DefaultClient.CloseIdleConnections()
	out := scrape()
	for _, m := range []string{"rmem_agent_clients 0", "rmem_agent_pool_held_bytes ", "rmem_agent_pool_no_room 0", "rmem_spin_seconds_total{",
		`rmem_agent_lost_pages_total{client="exited",pid=""} 0`, `rmem_agent_faults_total{client="exited",pid=""} 0`,
		`rmem_agent_stall_seconds_total{client="exited",pid=""} 0`, `rmem_agent_budget_waits_total{client="exited",pid=""} 0`,
		`rmem_agent_shared_segments{state="paged"} 0`, "rmem_agent_shared_releases_total 0"} {
		if !strings.Contains(out, "\n"+m) {
			t.Errorf("%s is not exported before any program ran:\n%s", m, out)
		}
	}
	// memagent top --once against the same agent: one frame, rates over
	// one interval.
	r := maExec(t, nil, memagent, "top", "--once", "--interval", "200ms", "--admin-socket", a.admin)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "memagent top - ") || !strings.Contains(r.stdout, "    PID   RES REMOT BUDGT MISS/s") {
		t.Errorf("memagent top --once: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = maExec(t, nil, memagent, "run", "--socket", a.socket, "--metrics-listen", memdtest.FreeAddr(t), "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "metrics-listen") {
		t.Errorf("memagent run --metrics-listen with an agent running: exit %d, %q: want a flag error", r.code, r.stderr)
	}
	r = maExec(t, nil, memagent, append([]string{"serve", "--socket", filepath.Join(maAgentDir(t), "b.sock"), "--admin-socket", "",
		"--metrics-listen", addr}, p.args()...)...)
	if r.code == 0 || !strings.Contains(r.stderr, "metrics-listen") || !strings.Contains(r.stderr, "address already in use") {
		t.Errorf("memagent serve --metrics-listen on an address in use: exit %d, %q: want a flag error", r.code, r.stderr)
	}
}
