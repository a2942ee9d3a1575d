package apps

import (
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
