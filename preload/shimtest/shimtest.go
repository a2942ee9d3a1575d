// Package shimtest builds the LD_PRELOAD shim (with preload/build.sh, the
// build every other one uses) and C test programs with gcc, and runs
// programs under the shim, for the tests of preload and of the packages
// that serve it (pager).
//
// It is for tests only: it compiles into a temporary directory once per
// test binary and fails or skips the calling test on any problem.
package shimtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"rmem/pager/proto"
)

// preloadDir is the preload directory, found from this file.
func preloadDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	progMu    sync.Mutex
)

// Build compiles the shim (librmem.so) and preload/testdata's programs
// once per test binary and returns the directory that holds them. It skips
// the test when gcc is not installed.
func Build(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is not installed: cannot build the shim")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "rmem-shim-")
		if buildErr != nil {
			return
		}
		src := preloadDir()
		if buildErr = BuildShim(filepath.Join(buildDir, "librmem.so")); buildErr != nil {
			return
		}
		progs, _ := filepath.Glob(filepath.Join(src, "testdata", "*.c"))
		for _, p := range progs {
			if err := compile(p); err != nil {
				buildErr = err
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

// BuildShim builds librmem.so at out with preload/build.sh.
func BuildShim(out string) error {
	cmd := exec.Command("/bin/sh", filepath.Join(preloadDir(), "build.sh"), out)
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("preload/build.sh: %v\n%s", err, o)
	}
	return nil
}

// RemoveBuild removes what Build compiled; call it from TestMain after
// the tests ran.
func RemoveBuild() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// compile builds the test program src into the build directory.
func compile(src string) error {
	return compileAs(src, strings.TrimSuffix(filepath.Base(src), ".c"))
}

// compileAs builds src into the build directory as name, with extra gcc
// arguments after the source (libraries to link, -shared).
func compileAs(src, name string, extra ...string) error {
	args := []string{"-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
		"-I", filepath.Join(preloadDir(), "testdata"), "-o", filepath.Join(buildDir, name), src}
	out, err := exec.Command("gcc", append(args, extra...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gcc %s: %v\n%s", src, err, out)
	}
	return nil
}

// ProgAs compiles preload/testdata's program src (a path there; lib/
// holds the ones Build leaves to their tests: libraries, and programs
// linked with them) into
// the build directory as name, with extra gcc arguments after the source
// (a library to link, such as /usr/lib/x86_64-linux-gnu/libjemalloc.so.2,
// or -shared -fPIC for a library to dlopen), and returns name for Start.
func ProgAs(t testing.TB, src, name string, extra ...string) string {
	t.Helper()
	Build(t)
	progMu.Lock()
	defer progMu.Unlock()
	if err := compileAs(filepath.Join(preloadDir(), "testdata", src), name, extra...); err != nil {
		t.Fatal(err)
	}
	return name
}

// Prog compiles another package's test program src (which may include
// preload/testdata's common.h) into the build directory, and returns its
// name there for Start.
func Prog(t testing.TB, src string) string {
	t.Helper()
	Build(t)
	progMu.Lock()
	defer progMu.Unlock()
	abs, err := filepath.Abs(src)
	if err == nil {
		err = compile(abs)
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(filepath.Base(src), ".c")
}

// Proc is a program running under the shim.
type Proc struct {
	t      testing.TB
	Cmd    *exec.Cmd
	stdin  io.WriteCloser
	Lines  chan string // its stdout, a line at a time
	Stderr lockedBuffer
	waited chan error
}

// lockedBuffer is a bytes.Buffer that the test may read while exec's
// copying goroutine writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs argv under the shim, talking to the agent at sock, with env
// added. argv[0] names a program of the build directory, or a path. The
// program gets a process group of its own: the processes it forks are
// killed with it when the test ends.
func Start(t testing.TB, sock string, argv []string, env ...string) *Proc {
	t.Helper()
	return start(t, nil, sock, argv, env)
}

// StartAs is Start with the program running as user uid (and its group
// gid). The build directory is made readable to everyone; the agent's
// socket must be reachable by that user.
func StartAs(t testing.TB, uid, gid uint32, sock string, argv []string, env ...string) *Proc {
	t.Helper()
	if err := os.Chmod(Build(t), 0o755); err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if uid != uint32(os.Geteuid()) {
		cred = &syscall.Credential{Uid: uid, Gid: gid}
	}
	return start(t, cred, sock, argv, env)
}

// Nobody returns the uid and gid of user nobody, the ordinary user that
// tests run programs as (StartAs). It skips the test without that user,
// or without a /dev/userfaultfd for the agent to lend such a program.
// When the tests run as an ordinary user already, it returns that user:
// its programs take user-mode-only uffds (see start).
func Nobody(t testing.TB) (uid, gid uint32) {
	t.Helper()
	if os.Geteuid() != 0 {
		return uint32(os.Geteuid()), uint32(os.Getegid())
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	if _, err := os.Stat("/dev/userfaultfd"); err != nil {
		t.Skipf("no /dev/userfaultfd for the agent to lend: %v", err)
	}
	id, _ := strconv.ParseUint(u.Uid, 10, 32)
	g, _ := strconv.ParseUint(u.Gid, 10, 32)
	return uint32(id), uint32(g)
}

func start(t testing.TB, cred *syscall.Credential, sock string, argv []string, env []string) *Proc {
	t.Helper()
	dir := Build(t)
	if !filepath.IsAbs(argv[0]) && !strings.Contains(argv[0], "/") {
		if _, err := os.Stat(filepath.Join(dir, argv[0])); err == nil {
			argv[0] = filepath.Join(dir, argv[0])
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+filepath.Join(dir, "librmem.so"), proto.EnvSocket+"="+sock)
	if os.Geteuid() != 0 {
		// Tests without root: a uffd for faults from user mode only,
		// the one kind such a user may create (the test programs touch
		// their memory from their own code).
		cmd.Env = append(cmd.Env, proto.EnvUFFDUserMode+"=1")
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	p := &Proc{t: t, Cmd: cmd, Lines: make(chan string, 16), waited: make(chan error, 1)}
	cmd.Stderr = &p.Stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(p.Lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			p.Lines <- s.Text()
		}
	}()
	go func() {
		<-done
		p.waited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		go func() { // lines no one reads any more (a test that failed) must not stop the reader
			for range p.Lines {
			}
		}()
		<-done
	})
	return p
}

// Pid is the program's pid.
func (p *Proc) Pid() int32 { return int32(p.Cmd.Process.Pid) }

// Expect waits for the next stdout line and checks its prefix.
func (p *Proc) Expect(prefix string) string {
	p.t.Helper()
	select {
	case l, ok := <-p.Lines:
		if !ok {
			p.t.Fatalf("program ended before %q; stderr:\n%s", prefix, p.Stderr.String())
		}
		if !strings.HasPrefix(l, prefix) {
			p.t.Fatalf("program said %q, want %q; stderr:\n%s", l, prefix, p.Stderr.String())
		}
		return l
	case <-time.After(60 * time.Second):
		p.t.Fatalf("no %q from the program after 60s; stderr:\n%s", prefix, p.Stderr.String())
	}
	return ""
}

// Send writes b to the program's stdin.
func (p *Proc) Send(b string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, b); err != nil {
		p.t.Fatal(err)
	}
}

// Wait waits for the program to exit and fails on a nonzero status.
func (p *Proc) Wait() {
	p.t.Helper()
	if err := p.WaitErr(); err != nil {
		p.t.Fatalf("program: %v; stderr:\n%s", err, p.Stderr.String())
	}
}

// WaitErr waits for the program to exit and returns how it ended (nil:
// status 0).
func (p *Proc) WaitErr() error {
	p.t.Helper()
	for range p.Lines {
	}
	select {
	case err := <-p.waited:
		return err
	case <-time.After(60 * time.Second):
		p.t.Fatalf("program did not exit; stderr:\n%s", p.Stderr.String())
	}
	return nil
}
