package apps

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/tests/internal/memdtest"
)

// pgBudget is PostgreSQL's --local-mem: the agent's budget, in which its
// shared buffers (a MAP_SHARED|MAP_ANONYMOUS segment of the postmaster's,
// inherited by every backend) are paged.
const pgBudget = 96 << 20

// pgWorkload is deterministic SQL over pgbench's scale-16 data set (1.6M
// accounts, ~240 MiB with its index, prewarmed into 256 MiB of shared
// buffers): updates by key range, then sums.
var pgWorkload = []string{
	"update pgbench_accounts set abalance = abalance + (aid % 97) where aid % 7 = 3",
	"update pgbench_accounts set abalance = abalance - 5 where aid between 200000 and 600000",
	"select sum(abalance), count(*), sum(hashtext(filler)) from pgbench_accounts",
	"select bid, sum(abalance), min(aid), max(aid) from pgbench_accounts group by bid order by bid",
	"select sum(abalance) from pgbench_accounts where aid between 1000000 and 1300000",
}

// pgResult is what a PostgreSQL run measured.
type pgResult struct {
	out       string  // the workload's results
	tps       float64 // pgbench select-only
	shmemMiB  int64   // growth of Shmem in /proc/meminfo, start to end of the load
	pssMiB    int64   // PSS of all its processes, at the end
	idlePSS   int64   // PSS of all its processes, started and idle
	processes int
	stderr    string
}

// PostgreSQL (issue 36): shared_buffers of 256 MiB holding pgbench's
// scale-16 data set, under memagent run at 96 MiB local. The buffers are
// shared memory, paged once for the postmaster and its backends: the
// workload's results are exactly those of a plain run, the node's shared
// memory grows by no more than the budget and its margin (pages leave
// tmpfs, not only page tables), and the PSS of all its processes stays
// within the budget, the margin and their idle PSS. A plain run's shared
// memory grows by 256 MiB. The select-only TPS of both runs is logged.
func TestPostgreSQL(t *testing.T) {
	skipSharedInRing(t)
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		needs(t)
		t.Skip("PostgreSQL is not installed (Debian package postgresql)")
	}
	needs(t, "pgbench=postgresql-client", "psql=postgresql-client", "runuser=util-linux")
	pgbin := filepath.Dir(bins[len(bins)-1])
	plain := runPostgres(t, pgbin, nil)
	e := newEnvAgent(t, nil, []string{"--allow-user", "postgres", "--local-mem", strconv.Itoa(pgBudget)})
	for _, d := range []string{e.dir, e.bin} { // the socket's directory and the shim's, for user postgres
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rm := runPostgres(t, pgbin, e)
	t.Logf("plain: shared memory +%d MiB, PSS %d MiB (idle %d), %d processes, select-only %.0f TPS", plain.shmemMiB, plain.pssMiB, plain.idlePSS, plain.processes, plain.tps)
	t.Logf("rmem at %d MiB: shared memory +%d MiB, PSS %d MiB, %d processes, select-only %.0f TPS (%.2fx)", pgBudget>>20, rm.shmemMiB, rm.pssMiB, rm.processes, rm.tps, rm.tps/plain.tps)
	if rm.shmemMiB > 200 {
		t.Logf("postgres under memagent run: %s", tail(rm.stderr))
	}
	if rm.out != plain.out {
		t.Fatalf("results differ:\nplain:\n%s\nunder rmem:\n%s", plain.out, rm.out)
	}
	const margin = 16 // MiB: the budget's margin (pager.BudgetMargin is 0.5 MiB) and small segments not paged
	if limit := int64(pgBudget>>20) + margin; rm.shmemMiB > limit {
		t.Errorf("shared memory grew by %d MiB under rmem, over the budget + %d MiB (%d MiB); %d MiB plain", rm.shmemMiB, margin, limit, plain.shmemMiB)
	}
	if limit := int64(pgBudget>>20) + margin + plain.idlePSS; rm.pssMiB > limit {
		t.Errorf("PSS of PostgreSQL's processes %d MiB under rmem, over the budget + %d MiB + their idle PSS (%d MiB); %d MiB plain", rm.pssMiB, margin, limit, plain.pssMiB)
	}
}

// runPostgres makes a database cluster, starts PostgreSQL on it (under
// memagent run at pgBudget when e is set), loads it and measures.
func runPostgres(t *testing.T, pgbin string, e *env) pgResult {
	t.Helper()
	dir, err := os.MkdirTemp("", "pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	asPostgres := func(argv ...string) []string { return append([]string{"runuser", "-u", "postgres", "--"}, argv...) }
	if err := os.Chown(dir, pgUID(t), -1); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runuser", asPostgres(filepath.Join(pgbin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres")[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port := freePort(t)
	argv := asPostgres(filepath.Join(pgbin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "shared_buffers=256MB", "-c", "huge_pages=off", "-c", "fsync=off", "-c", "max_connections=20")
	if e != nil {
		argv = e.wrapAt(pgBudget, argv...)
	}
	p := memdtest.Start(t, "postgres", argv[0], argv[1:]...)
	var r pgResult
	stop := func() {
		exec.Command("runuser", asPostgres(filepath.Join(pgbin, "pg_ctl"), "-D", data, "stop", "-m", "fast")[1:]...).Run()
		if err := p.Stop(time.Minute); err != nil && e == nil {
			t.Logf("postgres: %v", err)
		}
		r.stderr = p.Output()
	}
	t.Cleanup(stop)
	memdtest.Eventually(t, 60*time.Second, "postgres accepting connections", func() error {
		if p.Exited() {
			t.Fatalf("postgres exited at start:\n%s", tail(p.Output()))
		}
		return exec.Command(filepath.Join(pgbin, "pg_isready"), "-q", "-h", dir, "-p", strconv.Itoa(port)).Run()
	})
	conn := []string{"-h", dir, "-p", strconv.Itoa(port), "-U", "postgres"}
	sql := func(q string) string {
		out, err := exec.Command("psql", append(conn, "-qAtX", "-c", q, "postgres")...).CombinedOutput()
		if err != nil {
			t.Fatalf("psql %q: %v\n%s\npostgres: %s", q, err, out, tail(p.Output()))
		}
		return string(out)
	}
	time.Sleep(time.Second) // idle: its background workers started
	r.idlePSS, _ = pgMemory()
	shm0 := meminfo(t, "Shmem")
	if out, err := exec.Command("pgbench", append(conn, "-i", "-s", "16", "-q", "postgres")...).CombinedOutput(); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	sql("create extension pg_prewarm")
	sql("select pg_prewarm('pgbench_accounts'), pg_prewarm('pgbench_accounts_pkey')")
	var out strings.Builder
	for _, q := range pgWorkload {
		fmt.Fprintf(&out, "%s\n%s", q, sql(q))
	}
	r.out = out.String()
	bench, err := exec.Command("pgbench", append(conn, "-S", "-T", "10", "-c", "4", "-j", "2", "postgres")...).CombinedOutput()
	if err != nil {
		t.Fatalf("pgbench -S: %v\n%s", err, bench)
	}
	if m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(bench); m != nil {
		r.tps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	r.shmemMiB = (meminfo(t, "Shmem") - shm0) >> 10
	r.pssMiB, r.processes = pgMemory()
	stop()
	return r
}

// pgMemory sums the PSS of user postgres's processes, MiB.
func pgMemory() (pssMiB int64, n int) {
	uid := strconv.Itoa(pgUIDOr(-1))
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var kib int64
	for _, d := range dirs {
		var st syscall.Stat_t
		if syscall.Stat(d, &st) != nil || strconv.Itoa(int(st.Uid)) != uid {
			continue
		}
		b, err := os.ReadFile(d + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				kib += v
				n++
			}
		}
	}
	return kib >> 10, n
}

// meminfo reads a /proc/meminfo field, KiB.
func meminfo(t *testing.T, field string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/meminfo", field)
	return 0
}

func pgUID(t *testing.T) int {
	uid := pgUIDOr(-1)
	if uid < 0 {
		t.Skip("no user postgres (Debian package postgresql makes it)")
	}
	return uid
}

func pgUIDOr(def int) int {
	out, err := exec.Command("id", "-u", "postgres").Output()
	if err != nil {
		return def
	}
	uid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return def
	}
	return uid
}
