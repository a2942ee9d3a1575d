package preload

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/preload/shimtest"
	"rmem/userfaultfd"
)

const libdir = "/usr/lib/x86_64-linux-gnu"

// needLib skips unless the shared library name is installed.
func needLib(t *testing.T, name, pkg string) string {
	t.Helper()
	lib := filepath.Join(libdir, name)
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("%s is not installed (Debian: %s)", lib, pkg)
	}
	return lib
}

// allocators are the builds of a test program against each allocator:
// glibc's (the shim is the allocator, glibc mode) and three others
// (foreign mode), linked as programs link them (DT_NEEDED, after the shim
// in the lookup order).
var allocators = []struct {
	name, lib, pkg string
	flags          []string
}{
	{"glibc", "", "", nil},
	{"jemalloc", "libjemalloc.so.2", "libjemalloc2, libjemalloc-dev", []string{"-DJEMALLOC"}},
	{"tcmalloc", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4", nil},
	{"mimalloc", "libmimalloc.so.2", "libmimalloc2.0", nil},
}

// progFor builds testdata/src linked with allocator i, and returns its name.
func progFor(t *testing.T, src string, i int) string {
	t.Helper()
	a := allocators[i]
	name := strings.TrimSuffix(src, ".c") + "-" + a.name
	args := slices.Clone(a.flags)
	if a.lib != "" {
		args = append(args, needLib(t, a.lib, a.pkg))
	}
	return shimtest.ProgAs(t, src, name, args...)
}

// python returns Debian's python3 (not a wrapper found first in PATH,
// such as pyenv's shim script, whose every exec and subprocess is a
// client of its own under the shim), or skips.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	return p
}

// inRegion reports whether addr lies in one of regs of kind.
func inRegion(regs []region, addr uint64, kind proto.Kind) bool {
	for _, r := range regs {
		if r.kind == kind && r.r.Contains(userfaultfd.Addr(addr)) {
			return true
		}
	}
	return false
}

// parseAddrs reads the hex addresses of a line "addrs 0x... 0x...".
func parseAddrs(t *testing.T, line string) []uint64 {
	t.Helper()
	var out []uint64
	for _, f := range strings.Fields(strings.TrimPrefix(line, "addrs ")) {
		v, err := strconv.ParseUint(strings.TrimPrefix(f, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("bad address %q in %q", f, line)
		}
		out = append(out, v)
	}
	return out
}

// TestAllocators runs allocs (the malloc family's corners, then 192
// blocks of 1 MiB and 2,000,000 of 56 bytes) linked with glibc, jemalloc,
// tcmalloc and mimalloc, with no agent and under the test agent, which
// evicts everything before the program checks it all. glibc mode pages the
// heap itself (heap regions only, small blocks in them); the others page
// the allocator's mmaps (mmap regions only). The jemalloc build calls
// malloc_usable_size, sallocx and sdallocx on memory from malloc and
// strdup: redis-server's calls, which crashed at start with the old shim
// (its malloc won over jemalloc's and handed out glibc's blocks).
func TestAllocators(t *testing.T) {
	skipLong(t, "four allocators' workloads", 142)
	for i, al := range allocators {
		t.Run(al.name, func(t *testing.T) {
			prog := progFor(t, "allocs.c", i)
			t.Run("no agent", func(t *testing.T) {
				p := start(t, filepath.Join(t.TempDir(), "none.sock"), []string{prog})
				p.Expect("addrs")
				p.Expect("ready")
				p.Send("g")
				p.Expect("ok")
				p.Wait()
			})
			t.Run("agent", func(t *testing.T) {
				bothModes(t, func(t *testing.T, env ...string) { testAllocs(t, al.lib, prog, env...) })
			})
		})
	}
}

// testAllocs runs allocs (prog) under the test agent, with env.
func testAllocs(t *testing.T, lib, prog string, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{prog}, env...)
	addrs := parseAddrs(t, p.Expect("addrs"))
	p.Expect("ready")
	const data = 192*256 + 2000000*56/4096 // pages holding what the program checks
	n := evict(t, a, p.Pid(), data)
	regs := a.Regions(p.Pid())
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	s := a.Stats(p.Pid())
	t.Logf("evicted %d pages; stats %+v", n, s)
	if s.Restores < data {
		t.Errorf("%d pages restored, want the %d that hold what the program checked", s.Restores, data)
	}
	if lib == "" {
		if len(s.Regions) != 1 || s.Regions[proto.KindHeap] == 0 {
			t.Errorf("regions %v: want heap regions only", s.Regions)
		}
		for _, addr := range addrs {
			if !inRegion(regs, addr, proto.KindHeap) {
				t.Errorf("block %#x is in no heap region %v", addr, regs)
			}
		}
	} else if len(s.Regions) != 1 || s.Regions[proto.KindMmap] == 0 {
		t.Errorf("regions %v: want mmap regions only (foreign mode)", s.Regions)
	}
	if strings.Contains(p.Stderr.String(), "rmem:") {
		t.Errorf("shim complained: %s", p.Stderr.String())
	}
}

// TestRedisServer runs Debian's redis-server (linked with
// libjemalloc.so.2) under the shim: with no agent it used to die of
// SIGSEGV at start; under the test agent it keeps 20,000 keys exactly
// across an eviction of everything, and a BGSAVE forks and writes them.
func TestRedisServer(t *testing.T) {
	redis, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (Debian: redis-server)")
	}
	build(t)
	for _, mode := range []string{"no agent", "agent", "agent/ring"} {
		t.Run(mode, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "none.sock")
			var a *testAgent
			agent := mode != "no agent"
			var env []string
			if agent {
				needUFFD(t)
				a = newTestAgent(t)
				sock = a.path
			}
			if mode == "agent/ring" {
				env = append(env, ringEnv)
			}
			dir := t.TempDir()
			rsock := filepath.Join(dir, "redis.sock")
			p := start(t, sock, []string{redis, "--port", "0", "--unixsocket", rsock, "--save", "",
				"--appendonly", "no", "--dir", dir, "--daemonize", "no", "--logfile", ""}, env...)
			for l := p.Expect(""); !strings.Contains(l, "ready to accept connections"); l = p.Expect("") {
			}
			c, err := net.Dial("unix", rsock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rd := bufio.NewReader(c)
			cmd := func(args ...string) string {
				t.Helper()
				var b strings.Builder
				fmt.Fprintf(&b, "*%d\r\n", len(args))
				for _, a := range args {
					fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
				}
				if _, err := c.Write([]byte(b.String())); err != nil {
					t.Fatal(err)
				}
				l, err := rd.ReadString('\n')
				if err != nil {
					t.Fatalf("%v: %v; stderr:\n%s", args, err, p.Stderr.String())
				}
				if strings.HasPrefix(l, "$") && l != "$-1\r\n" {
					n, _ := strconv.Atoi(strings.TrimSpace(l[1:]))
					buf := make([]byte, n+2)
					if _, err := io.ReadFull(rd, buf); err != nil {
						t.Fatal(err)
					}
					return string(buf[:n])
				}
				return strings.TrimSpace(l)
			}
			const keys = 20000
			val := func(i int) string { return strings.Repeat(strconv.Itoa(i), 1+i%40) }
			for i := range keys {
				if r := cmd("SET", "k"+strconv.Itoa(i), val(i)); r != "+OK" {
					t.Fatalf("SET: %q", r)
				}
			}
			if agent {
				evict(t, a, p.Pid(), 1000)
			}
			for i := range keys {
				if r := cmd("GET", "k"+strconv.Itoa(i)); r != val(i) {
					t.Fatalf("GET k%d: %q, want %q", i, r, val(i))
				}
			}
			if r := cmd("BGSAVE"); !strings.HasPrefix(r, "+Background saving started") {
				t.Fatalf("BGSAVE: %q", r)
			}
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(cmd("INFO", "persistence"), "rdb_bgsave_in_progress:0") {
				if time.Now().After(deadline) {
					t.Fatal("BGSAVE did not finish")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if st, err := os.Stat(filepath.Join(dir, "dump.rdb")); err != nil || st.Size() < keys*3 {
				t.Fatalf("dump.rdb: %v %v", st, err)
			}
			c.Write([]byte("*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")) // no reply: it exits
			p.Wait()
			if agent {
				s := a.Stats(p.Pid())
				t.Logf("stats %+v", s)
				if s.Restores == 0 || s.Regions[proto.KindMmap] == 0 || s.ForkEvents != 1 {
					t.Errorf("stats %+v: want jemalloc's memory in mmap regions, pages restored, one FORK event", s)
				}
			}
			if strings.Contains(p.Stderr.String(), "rmem: ") && agent {
				t.Errorf("shim complained: %s", p.Stderr.String())
			}
		})
	}
}

// TestGlibcPointersGoBackToGlibc: in glibc mode, blocks glibc's malloc
// made (here from __libc_malloc; in real programs the shim's own and those
// made during a fork) reach the shim's free, realloc and
// malloc_usable_size and go back to glibc, and libc's allocations for the
// program (threads' TLS, dlerror, stdio, getline) work.
func TestGlibcPointersGoBackToGlibc(t *testing.T) {
	build(t)
	t.Run("no agent", func(t *testing.T) {
		p := start(t, filepath.Join(t.TempDir(), "none.sock"), []string{"ownership"})
		p.Expect("ok")
		p.Wait()
	})
	t.Run("agent", func(t *testing.T) {
		needUFFD(t)
		a := newTestAgent(t)
		p := start(t, a.path, []string{"ownership"})
		p.Expect("ok")
		p.Wait()
	})
}

// TestForkHandlersBeforeTheShim: a library whose atfork handlers were
// registered before the shim's (libearly.c) runs them inside the shim's
// fork window, where the embedded jemalloc's locks are held: their
// allocations come from glibc (outside the heap), their frees of the heap's
// blocks wait for the handlers, and the program later reallocs and frees
// those blocks; none of it may deadlock.
func TestForkHandlersBeforeTheShim(t *testing.T) {
	dir := build(t)
	shimtest.ProgAs(t, "lib/libearly.c", "libearly.so", "-shared", "-fPIC")
	prog := shimtest.ProgAs(t, "lib/early.c", "early", filepath.Join(dir, "libearly.so"), "-Wl,-rpath,"+dir)
	for _, agent := range []bool{false, true} {
		t.Run(map[bool]string{false: "no agent", true: "agent"}[agent], func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "none.sock")
			var a *testAgent
			if agent {
				needUFFD(t)
				a = newTestAgent(t)
				sock = a.path
			}
			p := start(t, sock, []string{prog})
			p.Expect("child ok")
			addrs := parseAddrs(t, p.Expect("addrs"))
			var regs []region
			if agent {
				regs = a.Regions(p.Pid())
			}
			p.Expect("parent ok")
			p.Wait()
			if agent {
				if inRegion(regs, addrs[0], proto.KindHeap) || !inRegion(regs, addrs[1], proto.KindHeap) {
					t.Errorf("the prepare handler's block %#x should be glibc's and the program's %#x the heap's: %v",
						addrs[0], addrs[1], regs)
				}
			}
		})
	}
}

// TestProtNoneReservation: a 64 MiB PROT_NONE reservation is a region;
// pieces mprotect-ed read/write are paged (the registration survives
// mprotect); a mimalloc-style decommit (MAP_FIXED PROT_NONE over 4 MiB of
// it) keeps them in the region and they read as zeros when committed
// again, never as their evicted contents; a resident piece made PROT_NONE
// is evicted without killing the program (the helper reads it through
// /proc/self/mem); and mremap of the region is refused.
func TestProtNoneReservation(t *testing.T) { bothModes(t, testProtNoneReservation) }

func testProtNoneReservation(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"protnone"}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 4096) // the 16 MiB committed
	p.Send("g")
	p.Expect("ready2")
	// All 24 MiB resident now: [4, 8) recommitted and refilled (paged
	// only if registered again), [8, 9) PROT_NONE.
	evict(t, a, p.Pid(), 6144)
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	s := a.Stats(p.Pid())
	t.Logf("stats %+v", s)
	if s.Regions[proto.KindMmap] != 1 || s.Zaps < 1 || s.Restores < 3072+6144 {
		t.Errorf("stats %+v: want one mmap region, a REGION_ZAP for the decommit, every evicted page restored", s)
	}
}

// TestMinAllocDefault: direct mmaps of 64 KiB (the default min-alloc) and
// more become regions, smaller ones and ones over the 64 GiB cap do not; a
// shared anonymous one of 1 MiB becomes a region of kind shared.
func TestMinAllocDefault(t *testing.T) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"mapsizes"})
	p.Expect("ok")
	p.Wait()
	if s := a.Stats(p.Pid()); s.Regions[proto.KindMmap] != 2 || s.Regions[proto.KindShared] != 1 {
		t.Errorf("regions %v: want 2 mmap regions (64 KiB and 1 MiB) and 1 shared", s.Regions)
	}
	if proto.DefaultMinAlloc != 64<<10 {
		t.Errorf("pager/proto.DefaultMinAlloc %d, the shim's default is 64 KiB", proto.DefaultMinAlloc)
	}
}

// TestSharedMemory: MAP_SHARED mappings of shared memory (anonymous,
// /dev/shm, memfd) become regions of kind shared beside a private one
// (kind mmap); an EVICT naming a shared page is refused (EFAULT) and the
// agent's eviction of the rest works; in the program (testdata/shared.c),
// MADV_DONTNEED keeps their data and sends no REGION_ZAP, MADV_FREE fails
// as without the shim, MADV_REMOVE is the one REGION_ZAP of shared pages;
// mremap does not move or grow them (ENOMEM), shrinking is a REGION_DEL;
// MAP_FIXED over one is a REGION_DEL (never a REGION_ZAP) and the new
// memory no region; madvise of a range over a private region and a shared
// one takes each piece by its kind; a forked child and its parent see each
// other's writes;
// munmap is REGION_DEL. Resumed: the agent is restarted after the
// eviction, and the next one gets the regions again with their kinds.
func TestSharedMemory(t *testing.T) {
	bothModes(t, func(t *testing.T, env ...string) { testSharedMemory(t, false, env...) })
}

func TestSharedMemoryResumed(t *testing.T) {
	bothModes(t, func(t *testing.T, env ...string) { testSharedMemory(t, true, env...) })
}

func testSharedMemory(t *testing.T, restart bool, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"shared"}, env...)
	addrs := parseAddrs(t, p.Expect("addrs"))
	p.Expect("ready")
	if len(addrs) != 4 {
		t.Fatalf("addrs %x: want 4", addrs)
	}
	checkKinds := func(regs []region) {
		t.Helper()
		for i, what := range []string{"MAP_SHARED|MAP_ANONYMOUS", "/dev/shm", "memfd"} {
			if !inRegion(regs, addrs[i], proto.KindShared) || !inRegion(regs, addrs[i]+1<<20-1, proto.KindShared) {
				t.Errorf("the %s mapping at %#x is not a shared region: regions %+v", what, addrs[i], regs)
			}
		}
		if !inRegion(regs, addrs[3], proto.KindMmap) {
			t.Errorf("the private mapping at %#x is not an mmap region: regions %+v", addrs[3], regs)
		}
	}
	checkKinds(a.Regions(p.Pid()))
	m := proto.Evict{Batch: rawBatch, N: 1}
	m.Pages[0] = proto.EvictPage{Addr: userfaultfd.Addr(addrs[0]), Slot: 0}
	ev, err := a.Inject(p.Pid(), m.Encode(nil, 1), true)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Done != 0 || ev.Errno != unix.EFAULT {
		t.Errorf("EVICT of a shared page: EVICTED %+v, want 0 done and EFAULT", ev)
	}
	evict(t, a, p.Pid(), 256) // the private mapping (the shared ones the agent leaves alone)
	if restart {
		a.Close()
		waitStderr(t, p.Stderr.String, "rmem: lost the agent")
		a = newSuccessor(t, a)
		waitStderr(t, p.Stderr.String, "rmem: resumed with the agent")
		checkKinds(a.Regions(p.Pid()))
	}
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	s := a.Stats(p.Pid())
	t.Logf("stats %+v", s)
	if !restart && (s.Regions[proto.KindShared] != 4 || s.Regions[proto.KindMmap] < 2) {
		t.Errorf("regions by kind %v: want 4 shared and 2 private ones", s.Regions)
	}
	// REGION_ZAPs of shared pages: MADV_REMOVE's only. REGION_DELs: the
	// shrink, MAP_FIXED, four munmaps.
	if s.SharedZaps != 1 || s.SharedDels != 6 {
		t.Errorf("%d REGION_ZAPs and %d REGION_DELs of shared regions, want 1 (MADV_REMOVE) and 6", s.SharedZaps, s.SharedDels)
	}
	if s.Zaps-s.SharedZaps < 2 {
		t.Errorf("%d REGION_ZAPs of private regions, want 2 at least (MADV_DONTNEED and MADV_FREE of the mixed range)", s.Zaps-s.SharedZaps)
	}
	if restart && s.Restores < 256 {
		t.Errorf("%d pages restored by the next agent, want the 256 evicted of the private mapping", s.Restores)
	}
	stderr := p.Stderr.String()
	if restart {
		stderr = strings.NewReplacer("rmem: lost the agent", "", "rmem: resumed with the agent", "").Replace(stderr)
	}
	if strings.Contains(stderr, "rmem:") {
		t.Errorf("shim complained: %s", p.Stderr.String())
	}
}

// TestForkWhileAllocating forks 40 times while 3 threads allocate and
// free small and big blocks (the allocator maps, purges and unmaps, the
// shim talks to the agent for it) and the agent evicts: with the shim's
// heap (glibc mode) and with jemalloc and tcmalloc linked (foreign mode).
// A fork that took the shim's locks before the allocator's would deadlock
// against a thread inside the allocator waiting for the shim. With one P
// (make test-gomaxprocs1, which looks for the test agent starving) it forks
// 16 times: a fork takes 1.7 s there, 1 s with -race.
func TestForkWhileAllocating(t *testing.T) {
	skipLong(t, "forks while three allocators page", 116)
	needUFFD(t)
	var env []string
	if runtime.GOMAXPROCS(0) == 1 {
		env = append(env, "FORKSTRESS_FORKS=16")
	}
	for i, al := range allocators[:3] {
		t.Run(al.name, func(t *testing.T) {
			prog := progFor(t, "forkstress.c", i)
			if i > 0 {
				testForkWhileAllocating(t, prog, env...)
				return
			}
			bothModes(t, func(t *testing.T, mode ...string) { testForkWhileAllocating(t, prog, append(env, mode...)...) })
		})
	}
}

func testForkWhileAllocating(t *testing.T, prog string, env ...string) {
	a := newTestAgent(t)
	p := start(t, a.path, []string{prog}, env...)
	done := make(chan string, 1)
	go func() {
		l, ok := <-p.Lines
		if !ok {
			l = "EOF"
		}
		done <- l
	}()
	evictions := 0
	deadline := time.After(90 * time.Second)
	for {
		select {
		case l := <-done:
			if l != "ok" {
				t.Fatalf("program said %q; stderr:\n%s", l, p.Stderr.String())
			}
			p.Wait()
			t.Logf("%d pages evicted while forking; stats %+v", evictions, a.Stats(p.Pid()))
			return
		case <-time.After(20 * time.Millisecond):
			if n, err := a.Evict(p.Pid()); err == nil {
				evictions += n
			}
		case <-deadline:
			t.Fatalf("no \"ok\" after 90 s (a deadlock?); stderr:\n%s\nthreads:\n%s", p.Stderr.String(), threadDump(int(p.Pid())))
		}
	}
}

// TestDlopen: a library loaded by dlopen allocates in its constructor and
// registers atfork handlers; the program frees its memory (also after
// dlclose) and forks with and without its handlers; libm loads too.
func TestDlopen(t *testing.T) {
	dir := build(t)
	shimtest.ProgAs(t, "lib/libplug.c", "libplug.so", "-shared", "-fPIC")
	for _, agent := range []bool{false, true} {
		t.Run(map[bool]string{false: "no agent", true: "agent"}[agent], func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "none.sock")
			if agent {
				needUFFD(t)
				sock = newTestAgent(t).path
			}
			p := start(t, sock, []string{"dlopen", filepath.Join(dir, "libplug.so")})
			p.Expect("ok")
			p.Wait()
		})
	}
}

// TestExec: an image exec'd by a shimmed process is a new client of its
// own (its uffd was close-on-exec), with a heap of its own.
func TestExec(t *testing.T) { bothModes(t, testExec) }

func testExec(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"exec"}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 1000)
	p.Send("g")
	p.Expect("child ok")
	p.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hellos != 2 {
		t.Errorf("%d HELLOs, want 2 (the program and the image it exec'd)", a.hellos)
	}
	if a.handoffs < 1 {
		t.Errorf("no HANDOFF before the exec: a descriptor of paged shared memory could reach a program without the shim")
	}
}

// TestPythonDict pages CPython building a dict of 3,000,000 small
// objects: its obmalloc arenas (1 MiB mmaps) are mmap regions, its big
// tables come from the heap; every page is evicted, then the dict is read
// back whole and compared.
func TestPythonDict(t *testing.T) {
	skipLong(t, "a Python dict paged", 20)
	needUFFD(t)
	py := python(t)
	a := newTestAgent(t)
	script := `
import sys
n = 3_000_000
d = {i: str(i) for i in range(n)}
print("ready", flush=True)
sys.stdin.read(1)
assert len(d) == n
assert all(d[i] == str(i) for i in range(n)), "dict changed"
print("ok", sum(len(v) for v in d.values()), flush=True)
`
	p := start(t, a.path, []string{py, "-c", script})
	p.Expect("ready")
	n := evict(t, a, p.Pid(), 50000)
	p.Send("g")
	want := 0
	for i := range 3000000 {
		want += len(strconv.Itoa(i))
	}
	if l := p.Expect("ok"); l != "ok "+strconv.Itoa(want) {
		t.Errorf("python said %q, want ok %d", l, want)
	}
	p.Wait()
	s := a.Stats(p.Pid())
	t.Logf("evicted %d pages; stats %+v", n, s)
	if s.Regions[proto.KindMmap] < 100 || s.Regions[proto.KindHeap] == 0 || s.Restores < 50000 {
		t.Errorf("stats %+v: want obmalloc's arenas as mmap regions, heap regions, the dict's pages restored", s)
	}
}

// TestExports: librmem.so exports the shim's own functions and nothing
// else (the embedded jemalloc's symbols are hidden).
func TestExports(t *testing.T) {
	dir := build(t)
	out, err := exec.Command("nm", "-D", "--defined-only", filepath.Join(dir, "librmem.so")).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			got = append(got, f[2])
		}
	}
	slices.Sort(got)
	want := []string{"aligned_alloc", "calloc", "cfree", "fork", "free", "madvise", "malloc", "malloc_usable_size",
		"memalign", "mmap", "mmap64", "mprotect", "mremap", "munmap", "posix_memalign", "pvalloc", "realloc",
		"reallocarray", "sbrk", "valloc"}
	// Ring mode's wrappers (they pass through outside it): signal masks
	// and dispositions (sigwrap.c); calls that hand the kernel buffers
	// (kcall.c, kmisc.c) or wait (kwait.c); new programs (spawn.c).
	want = append(want, "bsd_signal", "posix_spawnattr_setsigmask", "pthread_attr_setsigmask_np", "pthread_sigmask",
		"sigaction", "sigblock", "sighold", "signal", "sigprocmask", "sigset", "sigsetmask", "sigsuspend", "sigwait",
		"ssignal", "sysv_signal")
	want = append(want, "__fxstat", "__fxstat64", "__fxstatat", "__fxstatat64", "__lxstat", "__lxstat64",
		"__pread64_chk", "__pread_chk", "__read_chk", "__recv_chk", "__recvfrom_chk", "__xstat", "__xstat64",
		"fstat", "fstat64", "fstatat", "fstatat64", "getdents64", "lstat", "lstat64", "pread", "pread64", "preadv",
		"preadv2", "preadv64", "preadv64v2", "pwrite", "pwrite64", "pwritev", "pwritev2", "pwritev64",
		"pwritev64v2", "read", "readdir", "readdir64", "readdir64_r", "readdir_r", "readv", "recv", "recvfrom",
		"recvmsg", "send", "sendmsg", "sendto", "stat", "stat64", "statx", "write", "writev")
	want = append(want, "__poll_chk", "__ppoll_chk", "clock_nanosleep", "epoll_pwait", "epoll_pwait2", "epoll_wait",
		"nanosleep", "poll", "ppoll", "pselect", "pthread_barrier_wait", "pthread_cond_clockwait",
		"pthread_cond_timedwait", "pthread_cond_wait", "pthread_mutex_lock", "pthread_mutex_timedlock",
		"pthread_rwlock_rdlock", "pthread_rwlock_wrlock", "select", "sem_timedwait", "sem_wait", "sigaltstack",
		"sigtimedwait", "sigwaitinfo", "syscall")
	// Paths and small structs (kmisc.c).
	want = append(want, "__open64_2", "__open_2", "__openat64_2", "__openat_2", "accept", "accept4", "access", "bind",
		"chdir", "chmod", "chown", "connect", "creat", "faccessat", "fopen", "fopen64", "fread", "fread_unlocked", "fwrite", "fwrite_unlocked", "__fread_chk", "freopen", "fstatfs", "getcwd",
		"getgroups", "getpeername", "getrandom", "getrlimit", "getrusage", "getsockname", "getsockopt", "lchown",
		"link", "mkdir", "mkdirat", "open", "open64", "openat", "openat64", "opendir", "pipe", "pipe2", "readlink",
		"readlinkat", "rename", "renameat", "rmdir", "sched_getaffinity", "sched_setaffinity", "setrlimit",
		"setsockopt", "socketpair", "statfs", "symlink", "sysinfo", "times", "truncate", "uname", "unlink",
		"unlinkat", "wait", "waitid", "waitpid")
	want = append(want, "execl", "execle", "execlp", "execv", "execve", "execvp", "execvpe", "fexecve", "popen",
		"posix_spawn", "posix_spawnp", "system")
	// Descriptors passed over a socket, and copies of those read and
	// written through (handoff.c; sendmsg is above).
	want = append(want, "dup", "dup2", "dup3", "sendmmsg")
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("librmem.so exports %v, want %v", got, want)
	}
}

// threadDump says where each thread of process pid and of its children
// is: its state, the kernel function it sleeps in and its kernel stack
// (root only), for a test that gives up waiting.
func threadDump(pid int) string {
	var b strings.Builder
	pids := []int{pid}
	if kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		for _, f := range strings.Fields(string(kids)) {
			if k, err := strconv.Atoi(f); err == nil {
				pids = append(pids, k)
			}
		}
	}
	for _, p := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", p))
		for _, task := range tasks {
			stat, _ := os.ReadFile(task + "/stat")
			wchan, _ := os.ReadFile(task + "/wchan")
			stack, _ := os.ReadFile(task + "/stack")
			fmt.Fprintf(&b, "%s: %s wchan %s\n%s", task, strings.TrimSpace(string(stat)), wchan, stack)
		}
	}
	return b.String()
}
