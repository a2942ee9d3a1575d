package userfaultfd

// Cross-process tests: the test binary re-executes itself as the served
// process (TestMain dispatches on childEnv), maps and registers memory,
// hands the uffd over a socketpair and touches its pages; the test process
// serves them and never touches the registered memory itself.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

const (
	childEnv     = "RMEM_UFFD_TEST_CHILD"
	childSockEnv = "RMEM_UFFD_TEST_SOCK"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		if err := childMain(spec); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// childSpec tells the child what to do.
type childSpec struct {
	Scenario string // "serve", "wp", "bench"
	Memory   string // "anon", "memfd"
	Mode     Mode
	Features Feature
	Pages    int
	Evict    bool // serve: drop every third page after the first pass and touch again
	TakeFD   bool // do not send the uffd; the parent takes it with pidfd_getfd
	Batch    int  // bench: pages resolved per fault (the child times the first touch of each batch)
	Faults   int  // bench: faults to time
}

// hello is the first message from the child: its region and uffd.
type hello struct {
	Addr, Len, Features, Ioctls, FD uint64
}

const helloSize = 40

func (h hello) encode() []byte {
	b := make([]byte, helloSize)
	for i, v := range []uint64{h.Addr, h.Len, h.Features, h.Ioctls, h.FD} {
		binary.LittleEndian.PutUint64(b[i*8:], v)
	}
	return b
}

func decodeHello(b []byte) hello {
	g := func(i int) uint64 { return binary.LittleEndian.Uint64(b[i*8:]) }
	return hello{g(0), g(1), g(2), g(3), g(4)}
}

// childResult is the child's last message.
type childResult struct {
	Checked    int
	Mismatches int
	First      string
	Baseline   []int64 // bench: ns per plain first-touch fault
	Latency    []int64 // bench: ns per served fault
	Elapsed    int64   // bench: ns for all served faults
}

type child struct {
	cmd    *exec.Cmd
	conn   *net.UnixConn
	stderr *bytes.Buffer
	hello  hello
	fds    []int // received descriptors: uffd, then memfd if any
}

// startChild starts the test binary as a served process and receives its
// hello.
func startChild(t testing.TB, spec childSpec) *child {
	t.Helper()
	// A listening socket, not a socketpair: SO_PEERCRED of a socketpair
	// names its creator, of an accepted connection the connecting process.
	path := fmt.Sprintf("%s/agent.sock", t.TempDir())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	js, _ := json.Marshal(spec)
	c := &child{stderr: new(bytes.Buffer)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(js), childSockEnv+"="+path)
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.conn != nil {
			c.conn.Close()
		}
		c.cmd.Process.Kill()
		c.cmd.Wait()
		closeAll(c.fds)
	})
	ln.SetDeadline(time.Now().Add(30 * time.Second))
	if c.conn, err = ln.AcceptUnix(); err != nil {
		t.Fatalf("child did not connect: %v; stderr: %s", err, c.stderr)
	}
	buf := make([]byte, helloSize)
	fds := make([]int, 2)
	n, nfds, err := RecvFDs(c.conn, buf, fds)
	if err != nil || n != helloSize {
		t.Fatalf("child hello: %d bytes, %v; stderr: %s", n, err, c.stderr)
	}
	c.fds = fds[:nfds]
	c.hello = decodeHello(buf)
	return c
}

func (c *child) send(t testing.TB, b ...byte) {
	t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		t.Fatalf("to child: %v; stderr: %s", err, c.stderr)
	}
}

func (c *child) expect(t testing.TB, want byte) {
	t.Helper()
	var b [1]byte
	if _, err := io.ReadFull(c.conn, b[:]); err != nil || b[0] != want {
		t.Fatalf("from child: %q, %v (want %q); stderr: %s", b[0], err, want, c.stderr)
	}
}

// result reads the child's result and waits for it to exit cleanly.
func (c *child) result(t testing.TB) childResult {
	t.Helper()
	var r childResult
	if err := json.NewDecoder(c.conn).Decode(&r); err != nil {
		t.Fatalf("child result: %v; stderr: %s", err, c.stderr)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child exit: %v; stderr: %s", err, c.stderr)
	}
	return r
}

// uffd wraps the child's uffd (received or taken back with pidfd_getfd).
func (c *child) uffd(t testing.TB, spec childSpec) *UFFD {
	t.Helper()
	fd := -1
	if spec.TakeFD {
		var err error
		fd, err = TakeFD(c.cmd.Process.Pid, int(c.hello.FD))
		if err != nil {
			t.Fatal(err)
		}
	} else {
		fd, c.fds = c.fds[0], c.fds[1:]
	}
	u, err := FromFD(fd, Feature(c.hello.Features))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// --- the child side ---

func childMain(specJSON string) error {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return err
	}
	if spec.Scenario == "open" {
		return childOpen()
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv(childSockEnv), Net: "unix"})
	if err != nil {
		return err
	}
	size := spec.Pages * ps
	var region []byte
	memfd := -1
	if spec.Memory == "memfd" {
		if memfd, err = unix.MemfdCreate("uffd-test", unix.MFD_CLOEXEC); err != nil {
			return err
		}
		if err := unix.Ftruncate(memfd, int64(size)); err != nil {
			return err
		}
		region, err = unix.Mmap(memfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	} else {
		region, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	}
	if err != nil {
		return err
	}
	if spec.Scenario == "wp" {
		for i := range spec.Pages { // populate before registering
			region[i*ps] = 1
		}
	}
	var baseline []int64
	if spec.Scenario == "bench" {
		one := spec
		one.Batch = 1 // the baseline is a plain one-page first-touch fault
		baseline = benchTouch(one, nil)
	}
	u, err := Open(spec.Features)
	if err != nil {
		return err
	}
	base := AddrOf(region)
	ioctls, err := u.Register(Range{base, uint64(size)}, spec.Mode)
	if err != nil {
		return err
	}
	h := hello{uint64(base), uint64(size), uint64(u.Features()), uint64(ioctls), uint64(u.Fd())}
	fds := []int{u.Fd()}
	if memfd >= 0 {
		fds = append(fds, memfd)
	}
	if spec.TakeFD {
		fds = nil
	}
	if err := SendFDs(conn, h.encode(), fds...); err != nil {
		return err
	}
	cmd := make([]byte, 9)
	if _, err := io.ReadFull(conn, cmd[:1]); err != nil || cmd[0] != 'g' {
		return fmt.Errorf("waiting for go: %q %v", cmd[0], err)
	}
	var res childResult
	switch spec.Scenario {
	case "serve":
		verifyPass(spec, region, 0, &res)
		if spec.Evict {
			if spec.Memory == "anon" {
				for i := 0; i < spec.Pages; i += 3 {
					if err := unix.Madvise(region[i*ps:(i+1)*ps], unix.MADV_DONTNEED); err != nil {
						return err
					}
				}
			} else { // the server punches holes in the memfd
				if _, err := conn.Write([]byte{'e'}); err != nil {
					return err
				}
				if _, err := io.ReadFull(conn, cmd[:1]); err != nil || cmd[0] != 'g' {
					return fmt.Errorf("waiting after eviction: %q %v", cmd[0], err)
				}
			}
			verifyPass(spec, region, 1, &res)
		}
	case "wp":
		for {
			if _, err := io.ReadFull(conn, cmd[:1]); err != nil {
				return err
			}
			if cmd[0] == 'q' {
				break
			}
			if _, err := io.ReadFull(conn, cmd[1:9]); err != nil {
				return err
			}
			for _, i := range writeSet(binary.LittleEndian.Uint64(cmd[1:]), spec.Pages) {
				region[i*ps+ps/2]++ // a write to a protected page faults
			}
			if _, err := conn.Write([]byte{'d'}); err != nil {
				return err
			}
		}
	case "wp-missing": // read (MISSING fault), check, then write (WP fault)
		verifyPass(spec, region, 0, &res)
		for i := range spec.Pages {
			region[i*ps+8]++
		}
	case "bench":
		start := time.Now()
		res.Latency = benchTouch(spec, region)
		res.Elapsed = int64(time.Since(start))
		res.Baseline = baseline
	}
	return json.NewEncoder(conn).Encode(res)
}

// expectZero says which pages the server resolves with ZeroPage.
func expectZero(spec childSpec, idx int) bool {
	return spec.Scenario == "serve" && spec.Memory == "anon" && idx%5 == 0
}

// evicted says which pages are dropped between the two passes.
func evicted(idx int) bool { return idx%3 == 0 }

func verifyPass(spec childSpec, region []byte, pass uint64, res *childResult) {
	for i := range spec.Pages {
		p := region[i*ps : (i+1)*ps] // the first access faults
		gen := uint64(0)
		if pass == 1 && evicted(i) {
			gen = 1
		}
		res.Checked++
		bad := false
		if expectZero(spec, i) {
			bad = !isZero(p)
		} else {
			bad = checkPattern(p, uint64(i), gen) >= 0
		}
		if bad {
			if res.Mismatches == 0 {
				res.First = fmt.Sprintf("pass %d page %d (want gen %d)", pass, i, gen)
			}
			res.Mismatches++
		}
	}
}

// writeSet is the pseudo-random set of pages written in one WP round.
func writeSet(seed uint64, pages int) []int {
	r := newRand(seed)
	set := make(map[int]bool)
	var out []int
	for range 1 + r.intn(pages/2) {
		i := r.intn(pages)
		if !set[i] {
			set[i] = true
			out = append(out, i)
		}
	}
	return out
}

// benchTouch times the first touch of every spec.Batch-th page, cycling
// through the region (dropped with MADV_DONTNEED between passes) until
// spec.Faults touches are timed. With region nil it uses a fresh plain
// anonymous mapping: the baseline.
func benchTouch(spec childSpec, region []byte) []int64 {
	if region == nil {
		var err error
		region, err = unix.Mmap(-1, 0, spec.Pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			panic(err)
		}
		defer unix.Munmap(region)
	}
	lat := make([]int64, 0, spec.Faults)
	stride := spec.Batch * ps
	for len(lat) < spec.Faults {
		for off := 0; off+stride <= len(region) && len(lat) < spec.Faults; off += stride {
			t0 := time.Now()
			region[off]++
			lat = append(lat, int64(time.Since(t0)))
			for k := off + ps; k < off+stride; k += ps {
				region[k]++ // the rest of the batch, already mapped
			}
		}
		unix.Madvise(region, unix.MADV_DONTNEED)
	}
	return lat
}

// --- the serving side ---

// pageServer resolves a child's faults: MINOR faults with Continue,
// missing pages with ZeroPage or Copy of generation gen[page].
type pageServer struct {
	t      testing.TB
	u      *UFFD
	spec   childSpec
	base   Addr
	buf    []byte
	gen    []uint64
	faults int
	minor  int
	dups   int // faults reported again after being resolved (EEXIST)
}

func (s *pageServer) fault(ev Event) error {
	addr := ev.Addr.RoundDown(PageSize)
	idx := int(uint64(addr-s.base) / PageSize)
	if idx < 0 || idx >= s.spec.Pages {
		return fmt.Errorf("fault at %v outside the region", ev.Addr)
	}
	var err error
	switch {
	case ev.Flags&FaultMinor != 0:
		_, err = s.u.Continue(Range{addr, PageSize}, 0)
	case expectZero(s.spec, idx):
		_, err = s.u.ZeroPage(Range{addr, PageSize}, 0)
	default:
		fillPattern(s.buf, uint64(idx), s.gen[idx])
		_, err = s.u.Copy(addr, s.buf, 0)
	}
	if IsExist(err) {
		// The kernel reports a fault again when a signal interrupts the
		// faulting thread before the fault is resolved (the child is a Go
		// program: preemption and GC signals do it, more so under -race).
		// The page is there; wake the thread and count it apart.
		s.dups++
		return s.u.Wake(Range{addr, PageSize})
	}
	s.faults++
	if ev.Flags&FaultMinor != 0 {
		s.minor++
	}
	s.gen[idx]++
	return err
}

func TestCrossProcessServe(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec childSpec
	}{
		{"anon-copy-zeropage", childSpec{Memory: "anon", Mode: ModeMissing}},
		{"anon-pidfd-getfd", childSpec{Memory: "anon", Mode: ModeMissing, TakeFD: true}},
		{"memfd-copy", childSpec{Memory: "memfd", Mode: ModeMissing, Features: FeatureMissingShmem}},
		{"memfd-minor-continue", childSpec{Memory: "memfd", Mode: ModeMissing | ModeMinor, Features: FeatureMinorShmem}},
		{"anon-evict-dontneed", childSpec{Memory: "anon", Mode: ModeMissing, Evict: true}},
		{"memfd-evict-punch-hole", childSpec{Memory: "memfd", Mode: ModeMissing, Evict: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skipUnlessFeatures(t, tc.spec.Features)
			spec := tc.spec
			spec.Scenario, spec.Pages = "serve", 300
			c := startChild(t, spec)
			if pid := c.cmd.Process.Pid; !spec.TakeFD {
				cred, err := PeerCred(c.conn)
				if err != nil || int(cred.Pid) != pid {
					t.Fatalf("peer credentials %+v, %v; child pid %d", cred, err, pid)
				}
			}
			u := c.uffd(t, spec)
			memfd := -1
			if spec.Memory == "memfd" {
				memfd = c.fds[0]
			}
			if spec.Mode&ModeMinor != 0 { // fill the page cache, leaving every 4th page a hole
				page := make([]byte, ps)
				for i := 0; i < spec.Pages; i++ {
					if i%4 != 0 {
						fillPattern(page, uint64(i), 0)
						if _, err := unix.Pwrite(memfd, page, int64(i*ps)); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			s := &pageServer{t: t, u: u, spec: spec, base: Addr(c.hello.Addr), buf: make([]byte, ps), gen: make([]uint64, spec.Pages)}
			stop := serve(t, u, s.fault)
			c.send(t, 'g')
			if spec.Evict && spec.Memory == "memfd" {
				c.expect(t, 'e')
				for i := 0; i < spec.Pages; i++ {
					if evicted(i) {
						if err := unix.Fallocate(memfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(i*ps), int64(ps)); err != nil {
							t.Fatal(err)
						}
					}
				}
				c.send(t, 'g')
			}
			res := c.result(t)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if res.Mismatches != 0 {
				t.Fatalf("%d of %d pages read back wrong, first: %s", res.Mismatches, res.Checked, res.First)
			}
			wantFaults := spec.Pages
			if spec.Evict {
				wantFaults += (spec.Pages + 2) / 3
			}
			if spec.Mode&ModeMinor != 0 && s.minor != spec.Pages-(spec.Pages+3)/4 {
				t.Errorf("%d minor faults, want %d", s.minor, spec.Pages-(spec.Pages+3)/4)
			}
			if s.faults != wantFaults {
				t.Errorf("served %d faults, want %d", s.faults, wantFaults)
			}
			t.Logf("%d pages verified, %d faults served (%d minor), %d reported again", res.Checked, s.faults, s.minor, s.dups)
		})
	}
}

func TestCrossProcessWriteProtect(t *testing.T) {
	t.Run("sync-faults", func(t *testing.T) {
		skipUnlessFeatures(t, FeaturePagefaultFlagWP)
		testWriteProtect(t, false)
	})
	t.Run("async-pagemap-scan", func(t *testing.T) {
		skipUnlessFeatures(t, FeatureWPAsync)
		testWriteProtect(t, true)
	})
}

// testWriteProtect has the child write pseudo-random page sets and checks
// that exactly those pages are found written: by their WP faults, or with
// async WP by a PAGEMAP_SCAN of the child's pagemap.
func testWriteProtect(t *testing.T, async bool) {
	spec := childSpec{Scenario: "wp", Memory: "anon", Mode: ModeWP, Pages: 256}
	if async {
		spec.Features = FeatureWPAsync
	}
	c := startChild(t, spec)
	u := c.uffd(t, spec)
	base := Addr(c.hello.Addr)
	r := Range{base, c.hello.Len}
	faulted := make(chan int, spec.Pages)
	stop := func() error { return nil }
	var scanner *DirtyScanner
	if async {
		var err error
		if scanner, err = OpenDirtyScanner(c.cmd.Process.Pid, 8); err != nil {
			t.Fatal(err)
		}
		defer scanner.Close()
	} else {
		stop = serve(t, u, func(ev Event) error {
			if ev.Flags&(FaultWP|FaultWrite) != FaultWP|FaultWrite {
				return fmt.Errorf("fault flags %#x, want WP|WRITE", ev.Flags)
			}
			faulted <- int(uint64(ev.Addr-base) / PageSize)
			return u.Unprotect(Range{ev.Addr.RoundDown(PageSize), PageSize}, 0)
		})
	}
	c.send(t, 'g')
	if err := u.WriteProtect(r); err != nil {
		t.Fatal(err)
	}
	var dirty []Range
	repeats := 0
	for round := range 6 {
		if !async && round > 0 {
			if err := u.WriteProtect(r); err != nil {
				t.Fatal(err)
			}
		}
		seed := uint64(1000 + round)
		cmd := make([]byte, 9)
		cmd[0] = 'w'
		binary.LittleEndian.PutUint64(cmd[1:], seed)
		c.send(t, cmd...)
		c.expect(t, 'd')
		got := make(map[int]bool)
		if async {
			var err error
			if dirty, err = scanner.Scan(r, dirty[:0]); err != nil {
				t.Fatal(err)
			}
			for _, d := range dirty {
				for a := range d.Pages(PageSize) {
					got[int(uint64(a-base)/PageSize)] = true
				}
			}
		} else {
		drain:
			for {
				select {
				case i := <-faulted:
					// A page can be reported twice in a round: a signal
					// to the faulting thread (the child is a Go program)
					// makes the kernel report the fault again. What
					// counts is the set of pages found written.
					if got[i] {
						repeats++
					}
					got[i] = true
				default:
					break drain
				}
			}
		}
		want := writeSet(seed, spec.Pages)
		if len(got) != len(want) {
			t.Errorf("round %d: %d pages found written, %d written", round, len(got), len(want))
		}
		for _, i := range want {
			if !got[i] {
				t.Errorf("round %d: written page %d not found", round, i)
			}
		}
	}
	c.send(t, 'q')
	c.result(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if repeats > 0 {
		t.Logf("%d WP faults reported again", repeats)
	}
	if async {
		if _, err := u.ReadEvents(make([]Msg, 1)); err != unix.EAGAIN {
			t.Errorf("async WP queued a message: %v", err)
		}
	}
}

// TestServedProcessGone: once the served process has exited, resolving
// reports IsGone instead of pretending to succeed.
func TestServedProcessGone(t *testing.T) {
	skipUnlessFeatures(t, 0)
	spec := childSpec{Scenario: "serve", Memory: "anon", Mode: ModeMissing, Pages: 4}
	c := startChild(t, spec)
	u := c.uffd(t, spec)
	c.cmd.Process.Kill()
	c.cmd.Wait()
	_, err := u.Copy(Addr(c.hello.Addr), make([]byte, ps), 0)
	if !IsGone(err) {
		t.Fatalf("copy into an exited process: %v, want ESRCH/ENOENT", err)
	}
	t.Logf("copy into an exited process: %v", err)
}

// TestCopyWriteProtected: a page copied with WriteProtected faults with
// FaultWP on the first write, which the server then allows.
func TestCopyWriteProtected(t *testing.T) {
	skipUnlessFeatures(t, FeaturePagefaultFlagWP)
	spec := childSpec{Scenario: "wp-missing", Memory: "anon", Mode: ModeMissing | ModeWP, Pages: 16}
	c := startChild(t, spec)
	u := c.uffd(t, spec)
	base := Addr(c.hello.Addr)
	var missing, wp int
	buf := make([]byte, ps)
	stop := serve(t, u, func(ev Event) error {
		page := ev.Addr.RoundDown(PageSize)
		if ev.Flags&FaultWP != 0 {
			wp++
			return u.Unprotect(Range{page, PageSize}, 0)
		}
		missing++
		fillPattern(buf, uint64(page-base)/PageSize, 0)
		_, err := u.Copy(page, buf, WriteProtected)
		return err
	})
	c.send(t, 'g')
	res := c.result(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if res.Mismatches != 0 {
		t.Fatalf("%d pages wrong, first %s", res.Mismatches, res.First)
	}
	if missing != spec.Pages || wp != spec.Pages {
		t.Errorf("%d missing and %d WP faults, want %d each", missing, wp, spec.Pages)
	}
}
