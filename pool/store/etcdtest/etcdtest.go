// Package etcdtest starts real etcd servers for tests: the etcd binary of
// the Debian package etcd-server (3.4), one member on free loopback ports
// with its data in the test's temporary directory, stopped when the test
// ends. Tests that need one skip, saying why, where the binary is missing.
//
// It is not for multi-host clusters (tests/chaos runs those in network
// namespaces).
package etcdtest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binary returns the etcd binary's path, or "" if it is not installed.
func Binary() string {
	if p := os.Getenv("RMEM_ETCD"); p != "" {
		return p
	}
	p, err := exec.LookPath("etcd")
	if err != nil {
		return ""
	}
	return p
}

// Skip skips t unless an etcd binary is installed.
func Skip(t testing.TB) {
	t.Helper()
	if Binary() == "" {
		t.Skip("no etcd binary: install the Debian package etcd-server (.ci/run does), or set RMEM_ETCD")
	}
}

// Server is a running single-member etcd.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	cmd      *exec.Cmd
	out      *bytes.Buffer
	mu       sync.Mutex
	done     chan struct{}
}

// MaxTxnOps is the --max-txn-ops the servers run with.
const MaxTxnOps = 4200

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts an etcd server, skipping t if there is no binary. It is
// stopped (SIGKILL) at the end of the test.
func Start(t testing.TB) *Server {
	t.Helper()
	Skip(t)
	dir := t.TempDir()
	for try := 0; ; try++ {
		cp, pp := freePort(t), freePort(t)
		s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", cp), out: &bytes.Buffer{}, done: make(chan struct{})}
		peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
		s.cmd = exec.Command(Binary(), "--name", "t", "--data-dir", filepath.Join(dir, fmt.Sprintf("data%d", try)),
			"--listen-client-urls", s.Endpoint, "--advertise-client-urls", s.Endpoint,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "t="+peer, "--initial-cluster-state", "new",
			"--max-txn-ops", fmt.Sprint(MaxTxnOps), "--logger", "zap", "--log-level", "warn")
		s.cmd.Stdout, s.cmd.Stderr = lockedWriter{s}, lockedWriter{s}
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("starting etcd: %v", err)
		}
		go func() { s.cmd.Wait(); close(s.done) }()
		if err := s.wait(15 * time.Second); err != nil {
			s.Kill()
			if try < 3 && strings.Contains(s.Output(), "address already in use") {
				continue // a port was taken between the probe and etcd's listen
			}
			t.Fatalf("etcd did not start: %v\n%s", err, s.Output())
		}
		t.Cleanup(func() {
			s.Kill()
			if t.Failed() {
				t.Logf("--- etcd output:\n%s", s.Output())
			}
		})
		return s
	}
}

type lockedWriter struct{ s *Server }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.out.Write(p)
}

// Output returns what etcd logged.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

func (s *Server) wait(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("etcd exited")
		default:
		}
		resp, err := hc.Get(s.Endpoint + "/health")
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if strings.Contains(b.String(), `"health":"true"`) {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not healthy within %v", timeout)
}

// Kill stops the server at once (SIGKILL) and waits for it.
func (s *Server) Kill() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}
