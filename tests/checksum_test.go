package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/tests/internal/memdtest"
)

// TestMemagentChecksums: bytes flipped in a live memory server's donated
// memory (through /proc/PID/mem, as a bad DIMM or a stray write would)
// while a program's pages are in the pool. With --replicas 2 the program
// reads its heap back exact (the agent reads the bad copies' pages from
// the other replica and says so in its log); with --replicas 1 it dies of
// SIGBUS, and never prints a wrong checksum.
func TestMemagentChecksums(t *testing.T) {
	maNeeds(t)
	bins := maBuild(t)
	p := maStartPool(t, 2)
	for _, replicas := range []int{2, 1} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			dir := t.TempDir()
			gate := filepath.Join(dir, "go")
			args := append([]string{"run", "--socket", filepath.Join(dir, "agent.sock"), "--local-mem", maLocalMem,
				"--replicas", strconv.Itoa(replicas), "--log-level", "warn"}, p.args()...)
			args = append(args, "--", filepath.Join(bins, "pattern"), strconv.Itoa(maHeapMiB), gate)
			cmd := exec.Command(filepath.Join(bins, "memagent"), args...)
			var stderr bytes.Buffer
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
			lines := bufio.NewScanner(out)
			written := make(chan bool, 1)
			go func() { written <- lines.Scan() && lines.Text() == fmt.Sprintf("written %d pages", maPages) }()
			select {
			case ok := <-written:
				if !ok {
					t.Fatalf("the program did not say it wrote its heap:\n%s", stderr.String())
				}
			case <-time.After(maRunLimit):
				t.Fatalf("the program did not write its heap within %v:\n%s", maRunLimit, stderr.String())
			}

			// The server with the program's first replicas (where the agent
			// reads first); with two replicas the other keeps good copies.
			slabs, err := maSlabs(p)
			if err != nil || len(slabs) == 0 {
				t.Fatalf("the pool's slabs: %v, %v", slabs, err)
			}
			victim := slabs[0].Replicas[0].Server
			flipped := memdtest.FlipDonated(t, p.servers[victim].Pid())
			t.Logf("%d slabs; %d bytes flipped in %s's donated memory", len(slabs), flipped, victim)
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			var rest strings.Builder
			for lines.Scan() {
				rest.WriteString(lines.Text() + "\n")
			}
			err = cmd.Wait()
			logs := stderr.String()
			want := fmt.Sprintf("checksum %016x\n", maSum(maPages*512, 0))
			switch replicas {
			case 2:
				if err != nil || rest.String() != want {
					t.Fatalf("with a good copy on the other replica: %v, stdout %q, want %q\n%s", err, rest.String(), want, logs)
				}
			case 1:
				if err == nil || strings.Contains(rest.String(), "checksum") {
					t.Fatalf("with the only copies changed: %v, stdout %q: want a death by SIGBUS, no checksum\n%s", err, rest.String(), logs)
				}
				if !strings.Contains(logs, "PAGE LOST") {
					t.Errorf("no PAGE LOST in the agent's log:\n%s", logs)
				}
			}
			if n := strings.Count(logs, "failed its checksum"); n == 0 {
				t.Errorf("the agent's log does not name a bad copy:\n%s", logs)
			}
			t.Logf("program: %v; agent log:\n%s", err, logs)
		})
	}
}
