package pager_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"rmem/client"
	"rmem/pager"
	"rmem/pager/pagertest"
	"rmem/pager/remote"
	"rmem/preload/shimtest"
	"rmem/userfaultfd"

	dto "github.com/prometheus/client_model/go"
)

const (
	childEnv = "RMEM_PAGER_TEST_CHILD"
	sockEnv  = "RMEM_PAGER_TEST_SOCK"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		if err := childMain(spec); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		shimtest.RemoveBuild()
		os.Exit(code)
	}))
}

// childSpec is what the child process does with its mapped memory.
type childSpec struct {
	Bytes    int    // mapped
	Passes   int    // rewrite passes (each a new generation)
	Order    string // read-back order: "reverse", "random", "stride", "wrap"
	Hold     bool   // after checking, print DONE and wait for stdin to close
	ReadOnly bool   // lost test: write, report WRITTEN, wait, then read
	Workload string // benchmarks: see benchChild
	Accesses int
	Repeat   int // benchmarks: run the workload this many times, report the fastest
}

type childResult struct {
	Pages    int
	Checksum uint64
	Bad      int
	First    string
}

func word(page, gen, w uint64) uint64 {
	x := page*0x9E3779B97F4A7C15 ^ gen*0xC2B2AE3D27D4EB4F ^ w
	x ^= x >> 29
	return x*0xBF58476D1CE4E5B9 + 1
}

// mapChild connects the child to the agent and maps n bytes through it.
// userMode reports whether the children take user-mode-only uffds: when
// the tests run without root, which may create no other kind where
// vm.unprivileged_userfaultfd is 0. Their faults all come from Go code.
func userMode() bool { return os.Geteuid() != 0 }

func mapChild(n int) (*client.Client, []byte, error) {
	c, err := client.ConnectWith(os.Getenv(sockEnv), client.Options{UserModeOnly: userMode()})
	if err != nil {
		return nil, nil, err
	}
	mem, err := c.Map(n)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, mem, nil
}

func childMain(specJSON string) error {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return err
	}
	if spec.Workload != "" {
		return benchChild(spec)
	}
	c, mem, err := mapChild(spec.Bytes)
	if err != nil {
		return err
	}
	defer c.Close()
	pages := spec.Bytes / 4096
	gen := uint64(0)
	for pass := 0; pass < max(spec.Passes, 1); pass++ {
		gen++
		for p := 0; p < pages; p++ {
			pg := mem[p*4096 : (p+1)*4096]
			for w := 0; w < 512; w += 64 { // a few words per page: writes every page
				binary.LittleEndian.PutUint64(pg[w*8:], word(uint64(p), gen, uint64(w)))
			}
		}
	}
	if spec.ReadOnly {
		fmt.Println("WRITTEN")
		bufio.NewReader(os.Stdin).ReadString('\n')
	}
	order := make([]int, pages)
	for i := range order {
		order[i] = i
	}
	switch spec.Order {
	case "reverse":
		for i := range order {
			order[i] = pages - 1 - i
		}
	case "random":
		rand.New(rand.NewSource(1)).Shuffle(pages, func(i, j int) { order[i], order[j] = order[j], order[i] })
	case "wrap":
		// make demo's walk: a stride modulo the size, so that the
		// stream's next fault is never along its stride.
		for i := range order {
			order[i] = i * 1531 % pages
		}
	case "stride":
		k := 0
		for s := 0; s < 7; s++ {
			for p := s; p < pages; p += 7 {
				order[k] = p
				k++
			}
		}
	}
	// A lost page raises SIGBUS; Go turns it into a panic we report.
	debug.SetPanicOnFault(true)
	defer func() {
		if e := recover(); e != nil {
			fmt.Printf("FAULT %v\n", e)
			if spec.Hold {
				bufio.NewReader(os.Stdin).ReadString('\n')
			}
			os.Exit(7)
		}
	}()
	res := childResult{Pages: pages}
	tab := crc64.MakeTable(crc64.ECMA)
	var b [8]byte
	for _, p := range order {
		pg := mem[p*4096 : (p+1)*4096]
		for w := 0; w < 512; w++ {
			got := binary.LittleEndian.Uint64(pg[w*8:])
			want := uint64(0)
			if w%64 == 0 {
				want = word(uint64(p), gen, uint64(w))
			}
			if got != want {
				if res.Bad == 0 {
					res.First = fmt.Sprintf("page %d word %d: %#x, want %#x", p, w, got, want)
				}
				res.Bad++
			}
			binary.LittleEndian.PutUint64(b[:], got)
			res.Checksum = crc64.Update(res.Checksum, tab, b[:])
		}
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if spec.Hold {
		fmt.Println("DONE")
		bufio.NewReader(os.Stdin).ReadString('\n')
	}
	return c.Unmap(mem)
}

// skipUnlessUFFD skips unless the child processes can have a uffd: as
// root the shim's kind (kernel faults delivered too), as another user one
// for faults from user mode only (the children touch their memory from Go
// code only: see userMode).
func skipUnlessUFFD(t *testing.T) {
	t.Helper()
	probe := userfaultfd.Probe
	if userMode() {
		probe = userfaultfd.ProbeUserMode
	}
	avail, _, err := probe()
	if err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	want := userfaultfd.FeaturePagefaultFlagWP | userfaultfd.FeatureEventUnmap
	if !avail.Has(want) {
		t.Skipf("kernel lacks userfaultfd features %v", want&^avail)
	}
}

func startAgent(t *testing.T, store remote.Store, localMem uint64) *pager.Agent {
	t.Helper()
	a, _ := startAgentReg(t, store, localMem)
	return a
}

func startAgentReg(t *testing.T, store remote.Store, localMem uint64) (*pager.Agent, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return startAgentOpts(t, pager.Options{Store: store, LocalMem: localMem, Registry: reg}), reg
}

// startAgentOpts runs an agent with opts, logging to t, on a socket of
// its own unless opts names one.
func startAgentOpts(t *testing.T, opts pager.Options) *pager.Agent {
	t.Helper()
	if opts.Socket == "" {
		opts.Socket = filepath.Join(t.TempDir(), "agent.sock")
	}
	opts.Log = zaptest.NewLogger(t)
	a, err := pager.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- a.Run(context.Background()) }()
	t.Cleanup(func() {
		a.Close()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return a
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// childTimeout bounds every wait for a child: a hung child fails its test
// (with the agent's stats) instead of hanging the suite.
const childTimeout = 60 * time.Second

func startChild(t *testing.T, a *pager.Agent, spec childSpec) *child {
	t.Helper()
	return startChildAs(t, nil, os.Args[0], a, spec)
}

// startChildAs starts the test binary bin as a child process of user
// cred (nil: ours).
func startChildAs(t *testing.T, cred *syscall.Credential, bin string, a *pager.Agent, spec childSpec) *child {
	t.Helper()
	js, _ := json.Marshal(spec)
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(js), sockEnv+"="+a.Addr())
	cmd.Stderr = os.Stderr
	if cred != nil && cred.Uid == uint32(os.Geteuid()) {
		cred = nil // already that user (the tests run without root)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	cmd.WaitDelay = 5 * time.Second
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		c.stdin.Close()
		if c.cmd.ProcessState == nil {
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL) // and anything it forked
			c.cmd.Wait()
		}
		for range c.lines {
		}
	})
	return c
}

func (c *child) line(t *testing.T) string {
	t.Helper()
	select {
	case s, ok := <-c.lines:
		if !ok {
			t.Fatalf("child output ended")
		}
		return strings.TrimSpace(s)
	case <-time.After(childTimeout):
		t.Fatalf("child silent for %v", childTimeout)
	}
	return ""
}

func (c *child) result(t *testing.T) childResult {
	t.Helper()
	var r childResult
	if err := json.Unmarshal([]byte(c.line(t)), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (c *child) wait(t *testing.T) error {
	t.Helper()
	c.stdin.Close()
	kill := time.AfterFunc(childTimeout, func() {
		t.Errorf("child did not exit within %v: killed", childTimeout)
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	})
	defer kill.Stop()
	return c.cmd.Wait()
}

func statsOf(t *testing.T, a *pager.Agent) pager.ClientStats {
	t.Helper()
	st := a.Stats()
	if len(st) != 1 {
		t.Fatalf("%d clients, want 1: %+v", len(st), st)
	}
	return st[0]
}

// A child maps 4× its budget, writes every page, reads back in another
// order: every word is right, and the agent evicted and fetched.
func TestOverBudget(t *testing.T) {
	skipUnlessUFFD(t)
	for _, order := range []string{"reverse", "random", "stride"} {
		t.Run(order, func(t *testing.T) {
			const budget = 1 << 20
			store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 1 << 20, SlabsPerServer: 16})
			a, reg := startAgentReg(t, store, budget)
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			c := startChild(t, a, childSpec{Bytes: 4 * budget, Passes: 2, Order: order, Hold: true})
			res := c.result(t)
			runtime.ReadMemStats(&m1)
			if res.Bad != 0 || res.Pages != 1024 {
				t.Fatalf("%d bad words of %d pages; first: %s", res.Bad, res.Pages, res.First)
			}
			if c.line(t) != "DONE" {
				t.Fatal("child did not finish")
			}
			// The budget bends by at most one eviction batch while faults
			// come in, and the evictor brings it back under once they stop.
			st := waitStats(t, a, func(st pager.ClientStats) bool { return st.ResidentBytes <= budget })
			t.Logf("stats: %+v", st)
			// Everything this process allocated during the run, per fault
			// (the test's goroutines included). The success path allocates
			// nothing; ioctls refused with EAGAIN while the client is in
			// madvise (then retried) allocate their *OpError.
			perFault := float64(m1.Mallocs-m0.Mallocs) / float64(st.Faults+st.WPFaults)
			t.Logf("allocations per fault (whole process): %.3f", perFault)
			if st.Evictions == 0 || st.RemoteReads == 0 || st.WriteBacks == 0 {
				t.Fatalf("no paging: %+v", st)
			}
			// The same figures as Prometheus metrics.
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := sumMetrics(mfs)
			if got["rmem_agent_evictions_total"] < float64(st.Evictions) || got["rmem_agent_fault_seconds"] == 0 ||
				got["rmem_agent_clients"] != 1 || got["rmem_agent_write_backs_total"] < float64(st.WriteBacks) ||
				st.InstallP50 > 0 && got["rmem_agent_install_p50_seconds"] == 0 {
				t.Fatalf("metrics disagree with stats %+v: %v", st, got)
			}
			if err := c.wait(t); err != nil {
				t.Fatal(err)
			}
			waitNoClients(t, a)
			noSlabsHeld(t, store, a)
			// Its final figures outlive it, for `memagent run --stats`.
			ex := a.Exited()
			if len(ex) != 1 || !ex[0].Exited || ex[0].ID != st.ID || ex[0].Evictions < st.Evictions || ex[0].RemoteReads < st.RemoteReads {
				t.Fatalf("exited stats %+v, last live %+v", ex, st)
			}
			// And in the metrics' "exited" series: a sum over clients
			// does not fall when one exits.
			if mfs, err = reg.Gather(); err != nil {
				t.Fatal(err)
			}
			if after := sumMetrics(mfs); after["rmem_agent_evictions_total"] != float64(ex[0].Evictions) ||
				after["rmem_agent_faults_total"] != float64(ex[0].Faults) || after["rmem_agent_clients"] != 0 {
				t.Fatalf("metrics once the client exited: %v; its final stats %+v", after, ex[0])
			}
		})
	}
}

// sumMetrics sums each family's series: counters and gauges, and the
// histograms' sample counts.
func sumMetrics(mfs []*dto.MetricFamily) map[string]float64 {
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				got[mf.GetName()] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[mf.GetName()] += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[mf.GetName()] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return got
}

// agentWait bounds each wait for the agent to get somewhere (checked
// after each turn of its loops and round of its reservoir: WaitForTest):
// one that does not get there fails its test instead of hanging the suite.
const agentWait = 30 * time.Second

// waitStats waits until the only client's stats satisfy ok.
func waitStats(t *testing.T, a *pager.Agent, ok func(pager.ClientStats) bool) pager.ClientStats {
	t.Helper()
	var sts []pager.ClientStats
	got := a.WaitForTest(agentWait, func() bool {
		sts = a.Stats()
		return len(sts) != 1 || ok(sts[0])
	})
	if len(sts) != 1 {
		t.Fatalf("%d clients, want 1: %+v", len(sts), sts)
	}
	if !got {
		t.Fatalf("stats never got there: %+v", sts[0])
	}
	return sts[0]
}

// noSlabsHeld checks that the agent gives every slab back once no process
// has pages in the pool (its reservoir does so within a few seconds: a
// slab's worth of slack is kept until no slot was asked for in a second).
func noSlabsHeld(t *testing.T, store *pagertest.Store, a *pager.Agent) {
	t.Helper()
	held := 0
	if !a.WaitForTest(agentWait, func() bool { _, held = store.Allocated(); return held == 0 }) {
		t.Fatalf("%d slabs held after every process paged from the store exited", held)
	}
}

func waitNoClients(t *testing.T, a *pager.Agent) {
	t.Helper()
	if !a.WaitForTest(agentWait, func() bool { return len(a.Stats()) == 0 }) {
		t.Fatalf("client not dropped after exit: %+v", a.Stats())
	}
}

// With every replica of evicted pages gone the child dies of SIGBUS: it
// never reads zeros.
func TestLostReplicasSIGBUS(t *testing.T) {
	skipUnlessUFFD(t)
	const budget = 256 << 10
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 1 << 20, SlabsPerServer: 4})
	a := startAgent(t, store, budget)
	c := startChild(t, a, childSpec{Bytes: 4 * budget, Order: "reverse", ReadOnly: true, Hold: true})
	if l := c.line(t); l != "WRITTEN" {
		t.Fatalf("child said %q", l)
	}
	waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 && st.ResidentBytes <= budget })
	store.Lose(0)
	store.Lose(1)
	io.WriteString(c.stdin, "go\n")
	if l := c.line(t); !strings.HasPrefix(l, "FAULT") {
		t.Fatalf("child read every page after its replicas were lost: %s", l)
	}
	if st := statsOf(t, a); st.Lost == 0 {
		t.Fatalf("no lost page counted: %+v", st)
	}
	err := c.wait(t)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("child ended with %v, want exit status 7 (it faulted)", err)
	}
}

// R=2 over tcp: a replica's server dies mid-run; every word still reads
// back right, served by the other replica.
func TestFailoverMidRun(t *testing.T) {
	skipUnlessUFFD(t)
	const budget = 512 << 10
	store := pagertest.New(t, pagertest.Options{Servers: 3, Replicas: 2, SlabSize: 1 << 20, SlabsPerServer: 8, Network: "tcp"})
	a := startAgent(t, store, budget)
	c := startChild(t, a, childSpec{Bytes: 4 * budget, Order: "random", ReadOnly: true, Hold: true})
	if l := c.line(t); l != "WRITTEN" {
		t.Fatalf("child said %q", l)
	}
	store.Kill(0)
	io.WriteString(c.stdin, "go\n")
	// Meanwhile restore redundancy as the pool would ask (replica-lost):
	// every replica on server 0 is copied from its survivor to server 1
	// or 2 while the child faults pages in and out.
	moved, err := store.Repair(context.Background(), 0)
	if err != nil {
		t.Fatalf("repair: %v", err)
	}
	res := c.result(t)
	if res.Bad != 0 {
		t.Fatalf("%d bad words; first: %s", res.Bad, res.First)
	}
	c.line(t)
	st := store.Table().Stats()
	t.Logf("replicas moved %d, rdma: %+v", moved, st)
	if moved == 0 || st.Copied == 0 {
		t.Fatalf("nothing was on server 0: moved %d, %+v", moved, st)
	}
	if err := c.wait(t); err != nil {
		t.Fatal(err)
	}
}

func benchCmd(sock, spec string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+spec, sockEnv+"="+sock)
	cmd.Stderr = os.Stderr
	return cmd
}

// The prefetch hit rate is measured on held-back samples, so a stride
// that wraps around (whose faults never land along it, where the stream's
// own accounting looks) shows its hits too; a sequential read-back uses
// every page it prefetched.
func TestPrefetchSampledHits(t *testing.T) {
	skipUnlessUFFD(t)
	for _, order := range []string{"reverse", "wrap"} {
		t.Run(order, func(t *testing.T) {
			const budget = 1 << 20
			store := pagertest.New(t, pagertest.Options{Servers: 1, SlabSize: 1 << 20, SlabsPerServer: 32})
			a := startAgent(t, store, budget)
			c := startChild(t, a, childSpec{Bytes: 16 * budget, Passes: 2, Order: order, Hold: true})
			if res := c.result(t); res.Bad != 0 {
				t.Fatalf("%d bad words; first: %s", res.Bad, res.First)
			}
			if c.line(t) != "DONE" {
				t.Fatal("child did not finish")
			}
			st := statsOf(t, a)
			t.Logf("prefetched %d, sampled hits %d, wasted %d", st.PrefetchIssued, st.PrefetchHits, st.PrefetchWasted)
			if st.PrefetchHits == 0 {
				t.Errorf("no sampled prefetch hit: %+v", st)
			}
			if order == "reverse" && st.PrefetchWasted != 0 {
				t.Errorf("a sequential read-back wasted %d sampled prefetches", st.PrefetchWasted)
			}
		})
	}
}

// Pool space follows the data when a program frees half its heap in a
// scatter that empties no slab (every other 128 KiB of 16 MiB): the agent
// drains the emptiest slabs, moving their pages to the others while the
// program runs, and gives them back, so the space held comes down to about
// 1.1x the space used plus a slab; the program then reads back exactly
// what it kept.
func TestPoolFollowsFrees(t *testing.T) {
	skipUnlessUFFD(t)
	prog := shimtest.Prog(t, "testdata/zaphalf.c")
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 1 << 20, SlabsPerServer: 32})
	a := startAgent(t, store, 2<<20)
	p := shimtest.Start(t, a.Addr(), []string{prog})
	p.Expect("ready")
	before := waitStats(t, a, func(st pager.ClientStats) bool { return st.RemoteBytes > 12<<20 })
	held0 := a.Pool().HeldBytes
	p.Send("g")
	p.Expect("zapped")
	var ps pager.PoolStats
	if !a.WaitForTest(agentWait, func() bool {
		ps = a.Pool()
		// Two batches of free slots are kept besides a slab (lowWater's
		// floor, above 1/11 of these small 1 MiB slabs).
		return float64(ps.HeldBytes) <= 1.1*float64(ps.UsedBytes)+float64(ps.SlabSize)+2*128*4096
	}) {
		t.Fatalf("the pool still holds %d bytes for %d used after the program freed half its heap: %+v", ps.HeldBytes, ps.UsedBytes, ps)
	}
	t.Logf("before the frees: %d held, %+v; after: %+v", held0, before, ps)
	if ps.Drained == 0 || ps.Relocated == 0 {
		t.Errorf("space came back without draining a slab: %+v", ps)
	}
	p.Send("g")
	p.Expect("ok")
	p.Wait()
	waitNoClients(t, a)
	noSlabsHeld(t, store, a)
}

// The whole pool unreachable (every server cut off, its memory intact):
// a fault on a page in the pool waits FaultTimeout for a replica to
// answer, then the program gets SIGBUS for it, never zeros and never an
// endless hang; the agent says so.
func TestPoolUnreachableSIGBUS(t *testing.T) {
	skipUnlessUFFD(t)
	const budget = 256 << 10
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 2, SlabSize: 1 << 20, SlabsPerServer: 4})
	a := startAgentOpts(t, pager.Options{Store: store, LocalMem: budget, FaultTimeout: 2 * time.Second})
	c := startChild(t, a, childSpec{Bytes: 4 * budget, Order: "reverse", ReadOnly: true, Hold: true})
	if l := c.line(t); l != "WRITTEN" {
		t.Fatalf("child said %q", l)
	}
	waitStats(t, a, func(st pager.ClientStats) bool { return st.Evictions > 0 && st.ResidentBytes <= budget })
	store.Kill(0)
	store.Kill(1)
	start := time.Now()
	io.WriteString(c.stdin, "go\n")
	if l := c.line(t); !strings.HasPrefix(l, "FAULT") {
		t.Fatalf("child read every page with the pool unreachable: %s", l)
	}
	took := time.Since(start)
	if st := statsOf(t, a); st.Lost == 0 || st.Retries == 0 {
		t.Fatalf("the page given up is not counted lost after retries: %+v", st)
	}
	t.Logf("SIGBUS after %v (fault timeout 2s)", took)
	if took < 2*time.Second {
		t.Errorf("gave up after %v, before the fault timeout", took)
	}
	err := c.wait(t)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("child ended with %v, want exit status 7 (it faulted)", err)
	}
}

// An agent that stops while its clients run (killed, restarted) leaves a
// journal in its StateDir; the next agent on the socket takes it over: the
// client (the Go client library here) reconnects with a resuming HELLO,
// and every page it had in the pool reads back exactly.
func TestAgentRestartResumes(t *testing.T) {
	skipUnlessUFFD(t)
	const budget = 1 << 20
	store := pagertest.New(t, pagertest.Options{Servers: 2, Replicas: 1, SlabSize: 1 << 20, SlabsPerServer: 16})
	dir := t.TempDir()
	opts := pager.Options{Store: store, LocalMem: budget, StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "agent.sock")}
	a1 := startAgentOpts(t, opts)
	c := startChild(t, a1, childSpec{Bytes: 4 * budget, Passes: 2, Order: "random", ReadOnly: true, Hold: true})
	if l := c.line(t); l != "WRITTEN" {
		t.Fatalf("child said %q", l)
	}
	before := waitStats(t, a1, func(st pager.ClientStats) bool { return st.RemoteBytes >= 2*budget })
	a1.Close() // as if killed: its client keeps its uffd and regions
	a2 := startAgentOpts(t, opts)
	var st pager.ClientStats
	if !a2.WaitForTest(agentWait, func() bool {
		sts := a2.Stats()
		if len(sts) == 1 {
			st = sts[0]
		}
		return len(sts) == 1
	}) {
		t.Fatal("the client did not resume with the new agent")
	}
	t.Logf("before %+v\nresumed %+v", before, st)
	if st.RemoteBytes < before.RemoteBytes/2 {
		t.Errorf("resumed with %d bytes remote, had %d", st.RemoteBytes, before.RemoteBytes)
	}
	io.WriteString(c.stdin, "go\n")
	res := c.result(t)
	if res.Bad != 0 || res.Pages != 1024 {
		t.Fatalf("after the agent restarted: %d bad words of %d pages; first: %s", res.Bad, res.Pages, res.First)
	}
	if c.line(t) != "DONE" {
		t.Fatal("child did not finish")
	}
	if s := statsOf(t, a2); s.RemoteReads == 0 || s.Lost != 0 {
		t.Fatalf("the new agent did not read the pages back from the pool: %+v", s)
	}
}
