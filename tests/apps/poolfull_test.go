package apps

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rmem/pager"
	"rmem/pool"
	"rmem/tests/internal/memdtest"
)

// The pool runs out while a program pages: python3 builds a dict of
// ~125 MiB under a 32 MiB budget in a pool of 64 MiB, and hashes it in
// insertion order (TestPythonDict's sort is the random-access run). The documented
// behaviour (docs/pager.md, Budget): its faults past the budget wait, the
// budget holds, the agent and the pool say so; when room returns (a second
// memory server joins) it carries on and its output is the plain run's.
func TestPoolFull(t *testing.T) {
	needs(t, "/usr/bin/python3=python3")
	script := `
import hashlib
d = {}
for i in range(400_000):
    d["k%d" % i] = (i, "v%07d" % (i * 7919 % 10_000_000))
h = hashlib.sha256()
for k, v in d.items():
    h.update(k.encode() + v[1].encode())
print(len(d), sum(v[0] for v in d.values()), h.hexdigest())
`
	argv := []string{"/usr/bin/python3", "-c", script}
	e := newEnvWith(t, "--capacity", "64MiB", "--slab-size", "16MiB")
	base := runBatch(t, []string{"/usr/bin/python3", "-c", "pass"}, "")
	plain := runBatch(t, argv, "")

	done := make(chan outcome, 1)
	errc := make(chan error, 1)
	go func() {
		oc, err := runBatchE(e.wrap(argv...), "")
		done <- oc
		errc <- err
	}()
	memd := filepath.Join(e.bin, "memd")
	var waited time.Duration
	memdtest.Eventually(t, 2*time.Minute, "the program waiting for pool room", func() error {
		st, err := e.stats()
		if err != nil {
			return err
		}
		if st.Pool.NoRoom == "" || len(st.Clients) == 0 || st.Clients[0].BudgetWaits == 0 {
			return fmt.Errorf("no room yet: %+v", st.Pool)
		}
		out, _, err := memdtest.Run(memd, nil, "status", "--json", "--coordinator", e.url, "--token", token)
		if err != nil {
			return err
		}
		var ps pool.Status
		if err := json.Unmarshal([]byte(out), &ps); err != nil || ps.AgentsNoRoom != 1 {
			return fmt.Errorf("memd status: %s", out)
		}
		waited = time.Since(st.Clients[0].NoRoomSince)
		return nil
	})
	// Waiting, not running on over its budget.
	time.Sleep(2 * time.Second)
	st, err := e.stats()
	if err != nil || len(st.Clients) != 1 {
		t.Fatalf("stats: %v %+v", err, st)
	}
	c := st.Clients[0]
	if limit := uint64(budget) + pager.BudgetMargin; c.ResidentBytes > limit {
		t.Errorf("resident %s while the pool is full (budget %s)", mib(c.ResidentBytes), mib(budget))
	}
	t.Logf("waiting for room for %v: %+v; pool %+v", waited, c, st.Pool)
	out, _, _ := memdtest.Run(memd, nil, "agents", "--coordinator", e.url, "--token", token)
	if !strings.Contains(out, "no room") {
		t.Errorf("memd agents does not say the agent has no room:\n%s", out)
	}

	e.addServer(t, "m2", "--capacity", "512MiB", "--slab-size", "16MiB") // room again
	var rm outcome
	select {
	case rm = <-done:
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the program did not carry on once the pool had room")
	}
	if rm.out != plain.out || rm.code != 0 {
		t.Fatalf("under memagent, after the pool was full: exit %d, output %q; plain %q\n%s", rm.code, rm.out, plain.out, tail(rm.stderr))
	}
	if limit := budget + pager.BudgetMargin + base.hwm + unpagedAllowance; rm.hwm > limit {
		t.Errorf("peak resident %s, limit %s", mib(rm.hwm), mib(limit))
	}
	if strings.Count(e.agent.Output(), "the pool gives no more memory") != 1 {
		t.Errorf("the agent should say once that the pool gives no more memory:\n%s", tail(e.agent.Output()))
	}
}
