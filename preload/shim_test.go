package preload

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rmem/pager/proto"
	"rmem/preload/shimtest"
	"rmem/userfaultfd"
)

func TestMain(m *testing.M) {
	code := m.Run()
	shimtest.RemoveBuild()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// build compiles the shim and the test programs once per test binary.
func build(t testing.TB) string { return shimtest.Build(t) }

// needUFFD skips unless this process can do what the shim does: create a
// userfaultfd with EVENT_FORK (root or CAP_SYS_PTRACE) and WP.
// skipLong skips a long workload (about secs seconds here) under -short:
// make check, the fast tier, leaves it to make test.
func skipLong(t *testing.T, what string, secs int) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: %s take about %d s; make test runs them", what, secs)
	}
}

func needUFFD(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the shim's userfaultfd uses EVENT_FORK (CAP_SYS_PTRACE)")
	}
	feat, _, err := userfaultfd.Probe()
	if err != nil {
		t.Skipf("userfaultfd not available: %v", err)
	}
	want := userfaultfd.FeatureEventFork | userfaultfd.FeatureEventUnmap |
		userfaultfd.FeaturePagefaultFlagWP | userfaultfd.FeatureThreadID
	if !feat.Has(want) {
		t.Skipf("kernel lacks userfaultfd features %v", want&^feat)
	}
}

// start runs a test program under the shim (shimtest.Start).
func start(t testing.TB, sock string, argv []string, env ...string) *shimtest.Proc {
	t.Helper()
	return shimtest.Start(t, sock, argv, env...)
}

// evict asks the agent to evict all resident pages of pid and requires
// at least min of them.
func evict(t *testing.T, a *testAgent, pid int32, min int) int {
	t.Helper()
	n, err := a.Evict(pid)
	if err != nil {
		t.Fatalf("evict pid %d: %v", pid, err)
	}
	if n < min {
		t.Fatalf("evicted %d pages of pid %d, want at least %d", n, pid, min)
	}
	return n
}

func TestAllocationsEvictedAndRestored(t *testing.T) { bothModes(t, testAllocationsEvictedAndRestored) }

func testAllocationsEvictedAndRestored(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"alloc"}, env...)
	p.Expect("ready")
	// 8+8+4+4+2+2+2 MiB of the malloc family, 6+3+2 of realloc, 1+1+8 of
	// mmap, all checked after the eviction: 12,032 pages at least come
	// back from the agent. The heap's other pages (jemalloc's metadata,
	// freed blocks) are evicted too, and need not be read again.
	n := evict(t, a, p.Pid(), 47*256)
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	s := a.Stats(p.Pid())
	t.Logf("evicted %d pages; stats %+v", n, s)
	if s.Restores < 47*256 {
		t.Errorf("%d pages restored from the agent, want the %d the program checks", s.Restores, 47*256)
	}
	// The heap's chunks (jemalloc's) and alloc's two mmaps; the mmaps'
	// munmaps of a head, a hole, mremap's source and tail, their ends.
	if s.Regions[proto.KindHeap] < 1 || s.Regions[proto.KindMmap] < 2 {
		t.Errorf("regions by kind %v: want heap and >= 2 mmap", s.Regions)
	}
	if s.Deletes < 6 || s.Zaps < 1 {
		t.Errorf("%d REGION_DELs and %d REGION_ZAPs, want >= 6 and >= 1 (MAP_FIXED over a region)", s.Deletes, s.Zaps)
	}
	if strings.Contains(p.Stderr.String(), "rmem:") {
		t.Errorf("shim complained: %s", p.Stderr.String())
	}
}

func TestAllocatorChunks(t *testing.T) { bothModes(t, testAllocatorChunks) }

func testAllocatorChunks(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"chunks"}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 3*1024+512)
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	s := a.Stats(p.Pid())
	if s.Regions[proto.KindMmap] != 4 || s.Zaps < 4 || s.RemoveEvts != 0 {
		t.Errorf("stats %+v: want 4 mmap regions, REGION_ZAPs for the four MADV_DONTNEED and MADV_FREE calls and no REMOVE event", s)
	}
}

func TestForkPrivateMemory(t *testing.T) { bothModes(t, testForkPrivateMemory) }

func testForkPrivateMemory(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"fork"}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 4096)
	p.Send("g")
	pids := map[byte]int32{}
	for range 2 {
		l := p.Expect("")
		if len(l) < 3 || (l[0] != 'P' && l[0] != 'C') {
			t.Fatalf("program said %q, want P/C <pid>", l)
		}
		pid, err := strconv.Atoi(l[2:])
		if err != nil {
			t.Fatal(err)
		}
		pids[l[0]] = int32(pid)
	}
	// Both wrote their own value over the same addresses: evict both.
	evict(t, a, pids['P'], 4096)
	evict(t, a, pids['C'], 4096)
	p.Send("gg")
	got := []string{p.Expect(""), p.Expect("")}
	p.Wait()
	if !(got[0] == "child ok" && got[1] == "parent ok") && !(got[1] == "child ok" && got[0] == "parent ok") {
		t.Fatalf("program said %q", got)
	}
	ps, cs := a.Stats(pids['P']), a.Stats(pids['C'])
	if ps.ForkEvents != 1 || !cs.ForkChild || cs.Restores < 4096 || ps.Restores < 2*4096 {
		t.Errorf("parent %+v child %+v", ps, cs)
	}
}

func TestThreadsWithConcurrentEviction(t *testing.T) { bothModes(t, testThreadsWithConcurrentEviction) }

func testThreadsWithConcurrentEviction(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"threads"}, env...)
	p.Expect("ready")
	total := 0
	for i := 0; i < 200 && (i < 5 || total == 0); i++ {
		total += evict(t, a, p.Pid(), 0)
		time.Sleep(20 * time.Millisecond)
	}
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	s := a.Stats(p.Pid())
	t.Logf("evicted %d pages while threads ran; stats %+v", total, s)
	if total == 0 {
		t.Errorf("nothing was evicted while the threads ran")
	}
}

func TestNoAgentFallsBack(t *testing.T) {
	build(t)
	sock := filepath.Join(t.TempDir(), "nobody.sock")
	p := start(t, sock, []string{"alloc"})
	p.Expect("ready")
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	want := "rmem: no agent at " + sock + " ("
	lines := strings.Split(strings.TrimSpace(p.Stderr.String()), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], want) || !strings.HasSuffix(lines[0], "): using ordinary memory") {
		t.Fatalf("stderr %q, want one line %q…", p.Stderr.String(), want)
	}
}

func TestRefusedHelloFallsBack(t *testing.T) {
	needUFFD(t)
	a := newTestAgent(t)
	a.mu.Lock()
	a.refuse = true
	a.mu.Unlock()
	p := start(t, a.path, []string{"threads"})
	p.Expect("ready")
	time.Sleep(50 * time.Millisecond)
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	if got := strings.Count(p.Stderr.String(), "\n"); got != 1 || !strings.Contains(p.Stderr.String(), "agent refused: test agent refuses") {
		t.Fatalf("stderr %q, want one line saying the agent refused", p.Stderr.String())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hellos != 1 {
		t.Fatalf("%d HELLOs, want 1 (the shim must not retry)", a.hellos)
	}
}

func TestPython(t *testing.T) {
	skipLong(t, "Python in both modes", 13)
	bothModes(t, testPython)
}

func testPython(t *testing.T, env ...string) {
	needUFFD(t)
	py := python(t)
	a := newTestAgent(t)
	script := `
import sys
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = (i // 4096) % 251
l = [bytes([i % 256]) * 3000 for i in range(2000)]
print("ready", flush=True)
sys.stdin.read(1)
assert all(b[i] == (i // 4096) % 251 for i in range(0, len(b), 4096)), "bytearray changed"
assert all(x == bytes([i % 256]) * 3000 for i, x in enumerate(l)), "list changed"
b += bytearray(8 << 20)
assert b[4096] == 1 and len(b) == 72 << 20
import os, subprocess
pid = os.fork()
if pid == 0:
    ok = b[8192] == 2 and len(bytearray(4 << 20)) == 4 << 20
    os._exit(0 if ok else 1)
assert os.waitpid(pid, 0)[1] == 0, "child failed"
assert subprocess.run(["true"]).returncode == 0
print("ok", flush=True)
`
	p := start(t, a.path, []string{py, "-c", script}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 16384)
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	if s := a.Stats(p.Pid()); s.Restores < 16384 {
		t.Errorf("stats %+v: want the bytearray's pages restored", s)
	}
}

// TestMinAllocFromEnv: the threshold concerns direct mmaps only (malloc
// is paged whole, in heap regions): with 64 MiB, alloc's 12 MiB mmap is
// ordinary memory while its heap is still paged.
func TestMinAllocFromEnv(t *testing.T) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"alloc"}, proto.EnvMinAlloc+"=64MiB")
	p.Expect("ready")
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	if s := a.Stats(p.Pid()); s.Regions[proto.KindMmap] != 0 || s.Regions[proto.KindHeap] == 0 {
		t.Fatalf("regions %v with RMEM_MIN_ALLOC=64MiB, want heap ones only", s.Regions)
	}
}

// TestOtherAllocators runs blocks (24 blocks of 2.5 MiB) with jemalloc,
// tcmalloc or mimalloc preloaded beside the shim. Either way the shim is
// in foreign mode: the allocator's malloc serves every call (the shim's,
// behind it, forwards to it), its memory comes from mmap (or sbrk), which
// the shim pages: mmap regions only. tcmalloc brings its own mmap and
// sbrk: in front of the shim its memory never reaches the shim (the
// program works, nothing is paged).
func TestOtherAllocators(t *testing.T) {
	skipLong(t, "allocators in front of and behind the shim", 13)
	needUFFD(t)
	const libdir = "/usr/lib/x86_64-linux-gnu"
	cases := []struct {
		name, lib string
		front     bool
		paged     bool
	}{
		{"jemalloc in front", "libjemalloc.so.2", true, true},
		{"jemalloc behind", "libjemalloc.so.2", false, true},
		{"tcmalloc in front", "libtcmalloc_minimal.so.4", true, false},
		{"tcmalloc behind", "libtcmalloc_minimal.so.4", false, true},
		{"mimalloc in front", "libmimalloc.so.2", true, true},
		{"mimalloc behind", "libmimalloc.so.2", false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lib := filepath.Join(libdir, c.lib)
			if _, err := os.Stat(lib); err != nil {
				t.Skipf("%s is not installed (Debian: libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0)", lib)
			}
			a := newTestAgent(t)
			shim := filepath.Join(build(t), "librmem.so")
			preload := shim + ":" + lib
			if c.front {
				preload = lib + ":" + shim
			}
			p := start(t, a.path, []string{"blocks"}, "LD_PRELOAD="+preload)
			p.Expect("ready")
			n := 0
			if c.paged {
				n = evict(t, a, p.Pid(), 24*640/2)
			}
			p.Send("g")
			p.Expect("ok")
			p.Wait()
			if !c.paged {
				a.mu.Lock()
				defer a.mu.Unlock()
				if a.hellos != 0 {
					t.Errorf("%d HELLOs, want none", a.hellos)
				}
				return
			}
			s := a.Stats(p.Pid())
			t.Logf("evicted %d pages; stats %+v", n, s)
			// The program reads back every page of its blocks (and checks
			// them); the allocator's other pages need not come back.
			if s.Regions[proto.KindMmap] == 0 || len(s.Regions) != 1 || s.Restores < min(n, 24*640) {
				t.Errorf("stats %+v: want mmap regions only, the blocks' evicted pages restored", s)
			}
		})
	}
}

// TestBadCommandsFromAgent: an EVICT naming memory the shim does not have,
// a page that is not resident (copying it would fault, and the fault wait
// for the agent, which waits for the EVICTED), or a slot beyond the staging
// area is refused page by page and the connection goes on; a malformed packet drops the connection, the shim
// says so once, and new allocations use ordinary memory.
func TestBadCommandsFromAgent(t *testing.T) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"hostile"})
	l := p.Expect("ready ")
	region, err := strconv.ParseUint(strings.TrimPrefix(l, "ready 0x"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	evictPkt := func(addr uint64, slot uint32) []byte {
		m := proto.Evict{Batch: rawBatch, N: 1}
		m.Pages[0] = proto.EvictPage{Addr: userfaultfd.Addr(addr), Slot: slot}
		return m.Encode(nil, 1)
	}
	for _, c := range []struct {
		name  string
		addr  uint64
		slot  uint32
		errno string
	}{
		{"unmapped address", 0x10000, 0, "bad address"},
		{"beyond the region", region + 2<<20, 0, "bad address"},
		{"not resident", region + 2<<20 - 4096, 0, "bad address"},
		{"unaligned", region + 8, 0, "invalid argument"},
		{"slot beyond staging", region, testSlots, "invalid argument"},
		{"drop-only entry, unmapped address", 0x10000, proto.NoSlot, "bad address"},
		{"drop-only entry, unaligned", region + 8, proto.NoSlot, "invalid argument"},
	} {
		m, err := a.Inject(p.Pid(), evictPkt(c.addr, c.slot), true)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if m.Done != 0 || m.Errno == 0 || m.Errno.Error() != c.errno {
			t.Errorf("%s: EVICTED %+v, want 0 done and %q", c.name, m, c.errno)
		}
	}
	// Still connected: a good eviction works (the region's pages but the
	// dropped one).
	evict(t, a, p.Pid(), 511)

	bad := (&proto.Ack{Seq: 1}).Encode(nil, 1)
	bad[0] = 'X'
	if _, err := a.Inject(p.Pid(), bad, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Stderr.String(), "rmem: lost the agent") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	if n := strings.Count(p.Stderr.String(), "rmem:"); n != 1 || !strings.Contains(p.Stderr.String(), "lost the agent (Protocol error)") {
		t.Fatalf("stderr %q, want one line about the lost agent", p.Stderr.String())
	}
}

// TestDeadAgentBlocksNotZeros: pages evicted to an agent that then dies
// are never read as zeros (DESIGN.md pitfall 5): the shim holds its own
// reference to the uffd, so the program waits in the fault instead.
func TestDeadAgentBlocksNotZeros(t *testing.T) { bothModes(t, testDeadAgentBlocksNotZeros) }

func testDeadAgentBlocksNotZeros(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"blocks"}, env...)
	p.Expect("ready")
	evict(t, a, p.Pid(), 24*640)
	a.Close()
	p.Send("g")
	select {
	case l, ok := <-p.Lines:
		t.Fatalf("program went on after its agent died: said %q (open %v); stderr:\n%s", l, ok, p.Stderr.String())
	case <-time.After(time.Second):
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		t.Fatalf("program exited: %v; stderr:\n%s", err, p.Stderr.String())
	}
	if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) == 0 || (f[0] != "S" && f[0] != "D") {
		t.Errorf("program state %q, want S or D (waiting in the fault)", f)
	}
	if !strings.Contains(p.Stderr.String(), "rmem: lost the agent") || strings.Contains(p.Stderr.String(), "FAIL") {
		t.Errorf("stderr %q: want the lost-agent line and no failure", p.Stderr.String())
	}
}

// TestForkInsideLibc: daemon() forks inside glibc, so the shim's fork()
// wrapper never runs; its atfork handlers do the same work: the child says
// HELLO as the parent's forked child (never on its parent's connection and
// uffd), and its own allocations go to the agent.
func TestForkInsideLibc(t *testing.T) { bothModes(t, testForkInsideLibc) }

func testForkInsideLibc(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"stray"}, env...)
	p.Expect("ready")
	p.Send("g")
	var child int32
	if _, err := fmt.Sscanf(p.Expect("child ok"), "child ok %d", &child); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if strings.Contains(p.Stderr.String(), "rmem:") {
		t.Errorf("stderr %q, want nothing from the shim", p.Stderr.String())
	}
	if s := a.Stats(p.Pid()); s.Regions[proto.KindMmap] != 1 {
		t.Errorf("parent's regions %v, want 1 mmap region", s.Regions)
	}
	if s := a.Stats(child); !s.ForkChild || s.Regions[proto.KindMmap] != 1 || s.Deletes != 1 {
		t.Errorf("child's stats %+v, want a forked child that added and deleted its 4 MiB region", s)
	}
}

// TestBadWelcome: a reply to HELLO that is not a good WELCOME (wrong type,
// an ERROR longer than allowed, a WELCOME without its staging memfd, bad
// magic) makes the shim use ordinary memory, saying so once.
func TestBadWelcome(t *testing.T) {
	needUFFD(t)
	longErr := append(appendHeaderForTest(proto.TypeError, 8+300), make([]byte, 8+300)...)
	longErr[proto.HeaderSize+4] = 1
	welcome := (&proto.Welcome{ClientID: 1, StagingSlots: 4}).Encode(nil, 1)
	badMagic := slices.Clone(welcome)
	badMagic[0] = 'X'
	for _, c := range []struct {
		name string
		pkt  []byte
		want string
	}{
		{"ack", (&proto.Ack{Seq: 1}).Encode(nil, 1), "unexpected reply to HELLO"},
		{"long error", longErr, "malformed ERROR"},
		{"welcome without memfd", welcome, "bad WELCOME"},
		{"bad magic", badMagic, "no usable reply to HELLO"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newTestAgent(t)
			a.mu.Lock()
			a.badHello = c.pkt
			a.mu.Unlock()
			p := start(t, a.path, []string{"hostile"})
			p.Expect("ready")
			p.Send("g")
			p.Expect("ok")
			p.Wait()
			if n := strings.Count(p.Stderr.String(), "\n"); n != 1 || !strings.Contains(p.Stderr.String(), c.want) ||
				!strings.HasSuffix(p.Stderr.String(), "using ordinary memory\n") {
				t.Fatalf("stderr %q, want one line with %q", p.Stderr.String(), c.want)
			}
		})
	}
}

func appendHeaderForTest(t proto.Type, bodyLen int) []byte {
	h := (&proto.Ack{}).Encode(nil, 1)[:proto.HeaderSize]
	h[6] = byte(t)
	h[12], h[13] = byte(bodyLen), byte(bodyLen>>8)
	return h
}

// TestAtforkHandlersAllocate: atfork handlers of other libraries run
// inside the shim's fork() (which holds its locks): their big allocations
// and frees must neither deadlock nor break the child's pairing.
func TestAtforkHandlersAllocate(t *testing.T) { bothModes(t, testAtforkHandlersAllocate) }

func testAtforkHandlersAllocate(t *testing.T, env ...string) {
	needUFFD(t)
	a := newTestAgent(t)
	p := start(t, a.path, []string{"atfork"}, env...)
	p.Expect("ok")
	p.Wait()
	if s := a.Stats(p.Pid()); s.ForkEvents != 1 {
		t.Errorf("parent stats %+v: want one FORK event", s)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hellos != 2 || len(a.forks) != 0 {
		t.Errorf("%d HELLOs and %d unclaimed forks, want 2 and 0", a.hellos, len(a.forks))
	}
	if p.Stderr.String() != "" {
		t.Errorf("stderr %q", p.Stderr.String())
	}
}

// TestForkThenUnmap: a region unmapped right after fork() in both
// processes. The agent must take the FORK event (and copy the regions for
// the child) before the parent's REGION_DEL: the kernel returns from fork
// in the parent only once the event is read. The test agent's uffd reader
// is made slow to hand events over (eventDelay), as a busy machine under
// GOMAXPROCS=1 once made it, when TestAtforkHandlersAllocate failed with
// "REGION_DEL of unknown region" (the child's, of a region its copy
// lacked).
func TestForkThenUnmap(t *testing.T) {
	needUFFD(t)
	a := newTestAgent(t)
	a.eventDelay.Store(int64(50 * time.Millisecond))
	p := start(t, a.path, []string{"forkunmap"})
	p.Expect("ok")
	p.Wait()
	if s := a.Stats(p.Pid()); s.ForkEvents != 1 || s.Deletes < 1 {
		t.Errorf("stats %+v: want a FORK event and the parent's REGION_DEL", s)
	}
}
