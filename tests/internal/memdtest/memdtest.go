package memdtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Build compiles cmd/memd once per test binary (with -race when the tests
// are) and returns its path.
func Build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "memdtest-bin-")
		if err != nil {
			buildErr = err
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..", "..")
		buildPath = filepath.Join(dir, "memd")
		args := []string{"build", "-o", buildPath}
		if raceEnabled {
			args = append(args, "-race") // race-check the daemons too
		}
		cmd := exec.Command("go", append(args, "./cmd/memd")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/memd: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// FreeAddr returns a loopback address with a port free right now.
func FreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Proc is a running process.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *SyncBuf
	done chan struct{}
	err  error
}

type SyncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Start runs bin with args. At the end of the test the process is killed
// and, if the test failed, its output is logged.
func Start(t *testing.T, name, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, cmd: exec.Command(bin, args...), out: &SyncBuf{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(os.Environ(), "MEMD_LOG_FORMAT=console")
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Signal(syscall.SIGKILL)
		<-p.done
		if strings.Contains(p.out.String(), "DATA RACE") {
			t.Errorf("the race detector found a data race in %s", name)
		}
		if t.Failed() {
			t.Logf("--- output of %s (%s):\n%s", name, strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

// Signal sends sig to the process if it still runs.
func (p *Proc) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill kills the process with SIGKILL and waits for it.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout for a clean exit.
func (p *Proc) Stop(timeout time.Duration) error {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %v", p.Name, timeout)
	}
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output returns what the process wrote so far.
func (p *Proc) Output() string { return p.out.String() }

// Run runs bin with args to completion (at most 30s) and returns its
// stdout, stderr and error.
func Run(bin string, env []string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Env = append(os.Environ(), env...)
	err = cmd.Run()
	return o.String(), e.String(), err
}

// Eventually polls cond every 50ms until it returns nil or timeout passes,
// and returns how long it took.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		if err = cond(); err == nil {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v: %v", what, timeout, err)
	return 0
}

// MlockFlag returns the --mlock setting for a memd donating bytes: true when
// this process may lock that much (root, or a large enough
// RLIMIT_MEMLOCK), else false, logged, so the rest still runs for real.
func MlockFlag(t *testing.T, bytes uint64) string {
	t.Helper()
	if os.Geteuid() == 0 {
		return "--mlock=true"
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err == nil && (rl.Max == unix.RLIM_INFINITY || rl.Max >= bytes) {
		return "--mlock=true"
	}
	t.Logf("not root and RLIMIT_MEMLOCK below %d bytes: memd runs with --mlock=false", bytes)
	return "--mlock=false"
}

// FlipDonated flips one byte every 7 pages and 333 bytes of memd pid's
// donated memory (its memd-slabs mapping), as a bad DIMM or a stray write
// would, and returns how many.
func FlipDonated(t *testing.T, pid int) int {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var lo, hi uint64
	for _, l := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(l); len(f) >= 6 && strings.Contains(f[5], "memd-slabs") {
			if _, err := fmt.Sscanf(f[0], "%x-%x", &lo, &hi); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if hi == 0 {
		t.Fatalf("no memd-slabs mapping in memd %d:\n%s", pid, maps)
	}
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	n := 0
	b := make([]byte, 1)
	for off := lo + 1000; off < hi; off += 7*4096 + 333 {
		if _, err := mem.ReadAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x5a
		if _, err := mem.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}
