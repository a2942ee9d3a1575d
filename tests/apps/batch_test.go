package apps

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// batch is a program that runs to completion on its input.
type batch struct {
	name     string
	tool     string   // binary=Debian package, for needs
	argv     []string // the run
	stdin    string
	baseline []string // the same program doing (almost) nothing
	env      []string // e.g. an allocator preloaded, in both runs
	budget   uint64   // --local-mem; 0: the suite's budget
	half     bool     // budget is about 1/2 of its data, not 1/4 (say why)
	traced   bool     // paged from outside (no shim): no fault ring in ring mode
}

func runBatchApp(t *testing.T, b batch) {
	needs(t, b.tool)
	e := newEnv(t)
	base := runBatch(t, b.baseline, "", b.env...)
	plain := runBatch(t, b.argv, b.stdin, b.env...)
	if plain.code != 0 {
		t.Fatalf("%s failed without rmem (exit %d): %s", b.name, plain.code, tail(plain.stderr))
	}
	if b.budget == 0 {
		b.budget = budget
	}
	factor := uint64(4)
	if b.half {
		factor = 2
	}
	s := e.watch()
	rm := runBatch(t, e.wrapAt(b.budget, b.argv...), b.stdin, b.env...)
	peak, agentRSS := s.end()
	s.checkRing(t, b.name, b.traced)
	compare(t, b.name, b.budget, factor, plain, rm, base.hwm, peak, agentRSS)
}

// CPython: a dict of 400k small objects (keys, tuples, strings: obmalloc's
// arenas, and the dict's table from malloc), sorted and hashed, at 24 MiB
// local of its ~125 MiB. Its sort reads the objects in random order, so
// nearly every read past the budget is a fault: with 600k objects at 32
// MiB it took 100 s of CI's 30 minutes (720k faults over tcp), this one
// about half; the paging it checks is the same.
func TestPythonDict(t *testing.T) {
	script := `
import hashlib
d = {}
for i in range(400_000):
    d["k%d" % i] = (i, "v%07d" % (i * 7919 % 10_000_000))
h = hashlib.sha256()
for k in sorted(d, key=lambda k: d[k][1])[::1000]:
    h.update(k.encode())
print(len(d), sum(v[0] for v in d.values()), h.hexdigest())
`
	runBatchApp(t, batch{name: "python3 dict", tool: "/usr/bin/python3=python3",
		argv: []string{"/usr/bin/python3", "-c", script}, baseline: []string{"/usr/bin/python3", "-c", "pass"},
		budget: 24 << 20})
}

const sqliteScript = `
CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1000000)
INSERT INTO t SELECT x, (x * 7919) % 1000003, printf('row-%08d-%s', x, hex(x * 2654435761 % 4294967296)) FROM c;
CREATE INDEX ta ON t(a);
SELECT count(*), sum(a), max(b), min(b) FROM t;
SELECT a % 7, count(*) FROM t GROUP BY a % 7 ORDER BY 1;
SELECT sum(length(b)) FROM t WHERE a BETWEEN 1000 AND 60000;
`

// sqliteBudget is the sqlite runs' --local-mem, 1/4 of their database
// (~66 MiB). The database is smaller than the others' data, and its range
// query is short, because every row it reads through the index is a random
// page of the table: over 90% of the rows it took 171 s under rmem at 50%
// local (1.47M faults; issue 17 is the fault path's speed), too long for CI.
const sqliteBudget = 16 << 20

// sqlite3 with glibc's malloc: an in-memory database of 1M rows and an
// index.
func TestSQLite(t *testing.T) {
	runBatchApp(t, batch{name: "sqlite3", tool: "sqlite3", argv: []string{"sqlite3", ":memory:"}, stdin: sqliteScript,
		baseline: []string{"sqlite3", ":memory:", "SELECT 1;"}, budget: sqliteBudget})
}

// The same with mimalloc: no Debian program links libmimalloc, which is
// meant to be preloaded (in both runs here).
func TestSQLiteMimalloc(t *testing.T) {
	lib := "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
	needs(t, "sqlite3")
	if !exists(lib) {
		t.Skipf("%s is not installed (Debian package libmimalloc2.0)", lib)
	}
	runBatchApp(t, batch{name: "sqlite3 + mimalloc", tool: "sqlite3", argv: []string{"sqlite3", ":memory:"}, stdin: sqliteScript,
		baseline: []string{"sqlite3", ":memory:", "SELECT 1;"}, env: []string{"LD_PRELOAD=" + lib}, budget: sqliteBudget})
}

// SWI-Prolog links libtcmalloc_minimal: lists of 500k integers mapped,
// sorted and summed on its own stacks. It runs with half its data local:
// its garbage collector marks and compacts the whole global stack again
// and again, so at 1/4 local every collection faults in every page: 1.57M
// faults, 142 s for a 2 s run (1.5M integers: over 5 minutes), the fault
// path's speed of issue 17. At ~1/2 it takes 3.5 s.
func TestSWIProlog(t *testing.T) {
	goal := "numlist(1,500000,L), maplist([X,Y]>>(Y is X*7919 mod 1000003), L, M), msort(M,S), sum_list(S,T), " +
		"length(S,N), last(S,Z), format('~w ~w ~w~n',[T,N,Z]), halt."
	runBatchApp(t, batch{name: "swipl (tcmalloc)", tool: "swipl=swi-prolog-core", argv: []string{"swipl", "-g", goal},
		baseline: []string{"swipl", "-g", "halt."}, budget: 40 << 20, half: true})
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// A statically linked C program (gcc -static): no dynamic loader, so no
// shim; memagent run pages it from outside, under ptrace (package traced).
func TestStaticBinary(t *testing.T) {
	needs(t, "gcc")
	bin := filepath.Join(t.TempDir(), "staticheap")
	if out, err := exec.Command("gcc", "-O2", "-static", "-o", bin, "testdata/staticheap.c").CombinedOutput(); err != nil {
		t.Skipf("cannot link statically (Debian package libc6-dev): %v\n%s", err, out)
	}
	runBatchApp(t, batch{name: "static C", tool: "gcc", argv: []string{bin, "136"}, baseline: []string{bin, "0"}, traced: true})
}

// A Go program that does not use rmem/client: its runtime maps the heap
// with raw system calls; memagent run pages it from outside, under ptrace
// (package traced), its scavenger's madvise included.
func TestGoProgram(t *testing.T) {
	needs(t, "go")
	bin := filepath.Join(t.TempDir(), "goheap")
	if out, err := exec.Command("go", "build", "-o", bin, "testdata/goheap/main.go").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	runBatchApp(t, batch{name: "Go program", tool: "go", argv: []string{bin, "136"}, baseline: []string{bin, "0"}, traced: true})
}
