package apps

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// sharedMemoryScript: Python's multiprocessing.shared_memory, a 256 MiB
// segment in /dev/shm written by the parent, checked and rewritten by 3
// forked children (a third each), checked again by the parent. It prints
// OK or BAD, then the parent's resident shared memory (RssShmem) and the
// segment's pages in tmpfs (st_blocks), MiB, measured before it lets go.
const sharedMemoryScript = `
import hashlib, os, sys
import multiprocessing as mp
from multiprocessing import shared_memory
MB = 1 << 20; N = 256 * MB
def pat(i, gen): return hashlib.sha256(b"%d:%d" % (i, gen)).digest() * (MB // 32)
def rss_shmem():
    for l in open("/proc/self/status"):
        if l.startswith("RssShmem:"): return int(l.split()[1]) // 1024
def tmpfs_mib(s): return os.stat("/dev/shm/" + s.name.lstrip("/")).st_blocks * 512 >> 20
def child(name, k):
    s = shared_memory.SharedMemory(name=name)
    for i in range(k, 256, 3):
        if bytes(s.buf[i*MB:(i+1)*MB]) != pat(i, 0): print("BAD child", k, i, flush=True); raise SystemExit(1)
        s.buf[i*MB:(i+1)*MB] = pat(i, 1)
    s.close()
if __name__ == "__main__":
    mp.set_start_method("fork")
    s = shared_memory.SharedMemory(create=True, size=N)
    for i in range(256): s.buf[i*MB:(i+1)*MB] = pat(i, 0)
    ps = [mp.Process(target=child, args=(s.name, k)) for k in range(3)]
    for p in ps: p.start()
    for p in ps: p.join()
    ok = all(p.exitcode == 0 for p in ps)
    for i in range(256):
        if bytes(s.buf[i*MB:(i+1)*MB]) != pat(i, 1): ok = False; break
    print("OK" if ok else "BAD", rss_shmem(), tmpfs_mib(s), flush=True)
    s.close(); s.unlink()
`

// Python's shared memory (issue 36): a 256 MiB segment shared by four
// processes, at 64 MiB local. The segment is paged once for all of them
// (pager's shared.go), in the agent's budget (its --local-mem: 32 MiB
// here): exact, and its resident pages, in the parent's page tables and
// in tmpfs, stay within that budget and 16 MiB. A plain run keeps all 256
// MiB.
func TestPythonSharedMemory(t *testing.T) {
	needs(t, "/usr/bin/python3=python3")
	const local = 64 << 20
	e := newEnv(t)
	argv := []string{"/usr/bin/python3", "-c", sharedMemoryScript}
	plain := runBatch(t, argv, "")
	rm := runBatch(t, e.wrapAt(local, argv...), "")
	t.Logf("plain: %s; under rmem at 64 MiB local: %s", strings.TrimSpace(plain.out), strings.TrimSpace(rm.out))
	if rm.code != 0 {
		t.Fatalf("under rmem: exit %d\n%s", rm.code, tail(rm.stderr))
	}
	f := strings.Fields(rm.out)
	if len(f) != 3 || f[0] != "OK" {
		t.Fatalf("under rmem: %q\n%s", rm.out, tail(rm.stderr))
	}
	pf := strings.Fields(plain.out)
	if len(pf) != 3 || pf[0] != "OK" {
		t.Fatalf("plain run: %q", plain.out)
	}
	const limit = budget>>20 + 16 // the agent's budget: the segment's
	for i, what := range []string{"the parent's RssShmem", "the segment's pages in tmpfs"} {
		n, err := strconv.Atoi(f[i+1])
		if err != nil {
			t.Fatalf("%s: %q", what, f[i+1])
		}
		if n > limit {
			t.Errorf("%s: %d MiB under rmem, over the budget + 16 MiB (%d MiB); %s MiB in a plain run\n%s", what, n, limit, pf[i+1], tail(rm.stderr))
		}
	}
}

// keepScript writes a named segment of N MiB and leaves it in /dev/shm
// ("write N"), or checks its contents ("read N").
const keepScript = `
import hashlib, sys
from multiprocessing import shared_memory, resource_tracker
MB = 1 << 20
def pat(i): return hashlib.sha256(b"%d" % i).digest() * (MB // 32)
name, n = sys.argv[2], int(sys.argv[3])
if sys.argv[1] == "write":
    s = shared_memory.SharedMemory(name=name, create=True, size=n*MB)
    resource_tracker.unregister(s._name, "shared_memory")  # it outlives us
    for i in range(n): s.buf[i*MB:(i+1)*MB] = pat(i)
    s.close()
    print("written")
else:
    data = open("/dev/shm/" + name, "rb").read()
    bad = [i for i in range(n) if data[i*MB:(i+1)*MB] != pat(i)]
    print("OK" if not bad else "BAD %d MiB, first %d" % (len(bad), bad[0]))
`

// A named segment outlives the processes that mapped it (issue 36): when
// its last mapping goes, the agent writes its pages in the pool back into
// the file, so a process that reads the file later, without rmem, reads
// every byte written, never a hole.
func TestSharedMemoryOutlives(t *testing.T) {
	needs(t, "/usr/bin/python3=python3")
	e := newEnv(t)
	name := "rmem-apps-" + strconv.Itoa(os.Getpid())
	os.Remove("/dev/shm/" + name)
	t.Cleanup(func() { os.Remove("/dev/shm/" + name) })
	const mib = "128" // 4x the agent's budget
	w := runBatch(t, e.wrapAt(budget, "/usr/bin/python3", "-c", keepScript, "write", name, mib), "")
	if w.code != 0 || strings.TrimSpace(w.out) != "written" {
		t.Fatalf("writer under rmem: exit %d, %q\n%s", w.code, w.out, tail(w.stderr))
	}
	r := runBatch(t, []string{"/usr/bin/python3", "-c", keepScript, "read", name, mib}, "")
	if strings.TrimSpace(r.out) != "OK" {
		t.Fatalf("the segment read back without rmem: %q\n%s\nthe writer's stderr:\n%s", r.out, r.stderr, tail(w.stderr))
	}
}
