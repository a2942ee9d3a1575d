package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"rmem/pool"
	"rmem/tests/internal/memdtest"
)

// TestMemagentMaxSlowdown: with a slowdown target and no fixed budget, a
// program that writes a cold array once and then reads a hot one at
// random has its cold array sent to the pool while its hot one stays
// resident, and reads both back exact. The target is the agent's default
// (serve --max-slowdown) or asked for by the program (run --max-slowdown,
// in its HELLO). What it asserts is where the pages end up, not how fast.
func TestMemagentMaxSlowdown(t *testing.T) {
	maNeeds(t)
	bins := maBuild(t)
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 1)
	const coldMiB, hotMiB = 96, 8
	for _, tc := range []struct {
		name       string
		serve, run []string
	}{
		{"serve", []string{"--max-slowdown", "2%", "--local-mem", "1GiB"}, nil},
		{"run", []string{"--local-mem", "1GiB"}, []string{"--max-slowdown", "2"}},
		{"run in-thread", []string{"--local-mem", "1GiB"}, []string{"--max-slowdown", "2", "--in-thread"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := maServe(t, memagent, p, tc.serve...)
			stop := filepath.Join(t.TempDir(), "stop")
			args := append(append([]string{"run", "--socket", a.socket, "--log-level", "warn"}, tc.run...), "--",
				filepath.Join(bins, "hotcold"), fmt.Sprint(coldMiB), fmt.Sprint(hotMiB), stop)
			cmd := exec.Command(memagent, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			killer := time.AfterFunc(3*time.Minute, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
			defer killer.Stop()
			// A failed check ends the test before hotcold is told to stop:
			// it must not run on (it did, using a CPU for the rest of CI).
			t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
			lines := bufio.NewScanner(out)
			if !lines.Scan() || lines.Text() != "written" {
				cmd.Wait()
				t.Fatalf("hotcold did not start: %q\n%s", lines.Text(), stderr.String())
			}
			var first, last string
			memdtest.Eventually(t, 2*time.Minute, "the cold array mostly in the pool", func() error {
				st, err := a.stats(t)
				if err != nil {
					return err
				}
				if len(st.Clients) != 1 {
					return fmt.Errorf("%d clients", len(st.Clients))
				}
				s := st.Clients[0]
				last = fmt.Sprintf("resident %d MiB, remote %d MiB, budget %d MiB, stall %.2f%%, auto %v",
					s.ResidentBytes>>20, s.RemoteBytes>>20, s.BudgetBytes>>20, s.StallPct, s.Auto)
				if first == "" {
					first = last
				}
				switch {
				case !s.Auto:
					t.Fatalf("stats say the budget is fixed: %s", last)
				case s.BudgetBytes > 1<<30:
					t.Fatalf("budget over the ceiling (--local-mem 1GiB): %s", last)
				case s.RemoteBytes < coldMiB<<20*7/10:
					return fmt.Errorf("%s", last)
				case s.ResidentBytes < hotMiB<<20:
					// The hot array is read all the time: it stays, or
					// comes back once its misses show. (A program kept
					// off the CPU stalls little while the budget shrinks,
					// and the budget dips under its hot set for a while:
					// CI saw 1 MiB on a loaded machine.)
					return fmt.Errorf("the hot array (%d MiB) is not resident: %s", hotMiB, last)
				}
				return nil
			})
			t.Logf("first %s; then %s", first, last)
			// memd agents shows it, from the agent's next lease renewal.
			memdtest.Eventually(t, 30*time.Second, "memd agents showing the steered program", func() error {
				out, _, err := memdtest.Run(p.memd, nil, append([]string{"agents", "--json"}, p.args()...)...)
				if err != nil {
					return err
				}
				var ls []pool.LeaseView
				if err := json.Unmarshal([]byte(out), &ls); err != nil {
					return err
				}
				for _, l := range ls {
					if l.PID == a.proc.Pid() && l.Steered == 1 && l.SteeredRemote >= coldMiB<<20/2 && l.SteeredBudget > 0 {
						return nil
					}
				}
				return fmt.Errorf("memd agents: %s", out)
			})
			if err := os.WriteFile(stop, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			lines.Scan()
			got := lines.Text()
			if err := cmd.Wait(); err != nil || got != "ok" {
				t.Fatalf("hotcold: %v, %q (want exit 0, ok: both arrays exact)\n%s", err, got, stderr.String())
			}
		})
	}
}
