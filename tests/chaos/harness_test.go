package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/store/etcdtest"
	"rmem/tests/internal/memdtest"
)

const (
	token       = "chaos-test-token-0123456789abcdef"
	subnet      = "10.77.0."
	slabSize    = "16MiB"
	heapMiB     = 64 // the programs' heap, of which localMem (25%) stays resident
	electionTTL = 2 * time.Second
	hbTimeout   = 3 * time.Second
	leaseTTL    = "15s"
	prefix      = "/chaos"
	runLimit    = 3 * time.Minute
	// newLeaderWithin is N of "a new leader within N seconds": the
	// election TTL (the dead leader's lease must expire) plus the
	// campaign, the reload and a loaded machine's slack.
	newLeaderWithin = electionTTL + 6*time.Second
)

// result is one row of the table TestMain prints.
type result struct {
	scenario, injected, recovery string
	lost                         int
}

var (
	resultsMu sync.Mutex
	results   []result
)

func record(r result) {
	resultsMu.Lock()
	results = append(results, r)
	resultsMu.Unlock()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if len(results) > 0 {
		fmt.Println()
		fmt.Printf("%-32s %-58s %-44s %s\n", "SCENARIO", "INJECTED", "RECOVERY", "PAGES LOST")
		for _, r := range results {
			fmt.Printf("%-32s %-58s %-44s %d\n", r.scenario, r.injected, r.recovery, r.lost)
		}
		fmt.Println()
	}
	os.Exit(code)
}

// needs skips unless this machine can run a cluster in network
// namespaces: root, iproute2 with netns, etcd, gcc, userfaultfd.
func needs(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a multi-node pool in network namespaces")
	}
	if os.Geteuid() != 0 {
		t.Skip("network namespaces, veth and nftables need root")
	}
	for _, tool := range append([]string{"ip=iproute2", "gcc", "go"}, tools...) {
		name, pkg, _ := strings.Cut(tool, "=")
		if _, err := exec.LookPath(name); err != nil {
			if pkg == "" {
				pkg = name
			}
			t.Skipf("%s is not installed (Debian package %s; .ci/run installs it)", name, pkg)
		}
	}
	etcdtest.Skip(t)
	if _, err := os.Stat("/dev/userfaultfd"); err != nil {
		t.Skip("no /dev/userfaultfd in this kernel")
	}
	probe := fmt.Sprintf("rmemha-%d-probe", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace (ip netns add): %v %s", err, out)
	}
	exec.Command("ip", "netns", "del", probe).Run()
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func raceBuilt() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// build compiles memd and memagent (with -race when the tests are), the
// shim beside memagent, and testdata/churn.c, once.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "chaos-bin-"); buildErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		goBuild := []string{"go", "build"}
		if raceBuilt() {
			goBuild = append(goBuild, "-race")
		}
		steps := [][]string{
			append(append([]string(nil), goBuild...), "-o", filepath.Join(binDir, "memd"), "./cmd/memd"),
			append(append([]string(nil), goBuild...), "-o", filepath.Join(binDir, "memagent"), "./cmd/memagent"),
			{"preload/build.sh", filepath.Join(binDir, "librmem.so")}, // the shim as make builds it
			{"gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", filepath.Join(binDir, "churn"), "tests/chaos/testdata/churn.c"},
		}
		for _, s := range steps {
			cmd := exec.Command(s[0], s[1:]...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("%s: %v\n%s", strings.Join(s, " "), err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sweepStale deletes the namespaces of earlier runs whose process is gone
// (a test binary killed before its cleanups).
func sweepStale() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	re := regexp.MustCompile(`^(rmemha-(\d+)-\S+)`)
	for _, line := range strings.Split(string(out), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[2])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		exec.Command("ip", "netns", "del", m[1]).Run()
	}
}

// node is a host: a network namespace with eth0 on the cluster's bridge.
type node struct {
	name, ns, ip string
}

func (n *node) nsPath() string { return "/var/run/netns/" + n.ns }

// cluster is a pool on hosts in network namespaces joined by a bridge (in
// a hub namespace): etcd members e1..e3, coordinators c1..c3, memory
// servers s1..s3, an agent host a1, an observer ob (where the test's own
// clients dial from) and, for the proxy test, px.
type cluster struct {
	t      *testing.T
	id     string
	hub    string
	bin    string
	dir    string
	nodes  map[string]*node
	procs  map[string]*memdtest.Proc
	coords []string // ids
	obs    *client.Client
	// coordURL and serverData are what the coordinators advertise and the
	// memory servers register for their data plane (the proxy's addresses
	// in the proxy test).
	coordURL   func(id string) string
	serverData func(id string) string
}

var hostIPs = map[string]int{"ob": 5, "e1": 11, "e2": 12, "e3": 13, "c1": 21, "c2": 22, "c3": 23, "s1": 31, "s2": 32, "s3": 33, "s4": 34, "s5": 35, "s6": 36, "s7": 37, "s8": 38, "s9": 39, "s10": 40, "a1": 41, "px": 50}

// newCluster creates the namespaces and the bridge (deleted at the end of
// the test); nothing runs yet.
func newCluster(t *testing.T, hosts ...string) *cluster {
	t.Helper()
	sweepStale()
	c := &cluster{t: t, id: fmt.Sprintf("rmemha-%d", os.Getpid()), bin: build(t), nodes: map[string]*node{}, procs: map[string]*memdtest.Proc{}}
	dir, err := os.MkdirTemp("", "chaos-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	c.coordURL = func(id string) string { return "http://" + c.nodes[id].ip + ":7480" }
	c.serverData = func(id string) string { return "" }
	c.hub = c.id + "-hub"
	run(t, "ip", "netns", "add", c.hub)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", c.hub).Run() })
	run(t, "ip", "-n", c.hub, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", c.hub, "link", "set", "br0", "up")
	for i, h := range append([]string{"ob"}, hosts...) {
		n := &node{name: h, ns: c.id + "-" + h, ip: subnet + strconv.Itoa(hostIPs[h])}
		c.nodes[h] = n
		run(t, "ip", "netns", "add", n.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n.ns).Run() })
		veth := fmt.Sprintf("v%d", i)
		run(t, "ip", "link", "add", veth, "netns", c.hub, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
		run(t, "ip", "-n", c.hub, "link", "set", veth, "master", "br0", "up")
		run(t, "ip", "-n", n.ns, "addr", "add", n.ip+"/24", "dev", "eth0")
		run(t, "ip", "-n", n.ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", n.ns, "link", "set", "lo", "up")
	}
	c.obs, err = client.New("http://"+c.nodes["ob"].ip+":1", client.Options{Token: token, Timeout: 5 * time.Second, RetryFor: -1, DialContext: dialIn(c.nodes["ob"].nsPath())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.obs.CloseIdleConnections)
	return c
}

// dialIn dials from inside the network namespace at nsPath: the socket is
// made on a thread moved into it, which exits afterwards (the goroutine
// never unlocks it), so no thread of the test stays in another namespace.
func dialIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			runtime.LockOSThread()
			fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.Setns(fd, unix.CLONE_NEWNET)
				unix.Close(fd)
			}
			if err != nil {
				ch <- res{nil, fmt.Errorf("setns %s: %w", nsPath, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- res{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// listenIn listens on addr inside the network namespace at nsPath.
func listenIn(nsPath, addr string) (net.Listener, error) {
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err != nil {
			ch <- res{nil, err}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- res{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// start runs a process on host h.
func (c *cluster) start(name, h, bin string, args ...string) *memdtest.Proc {
	c.t.Helper()
	p := memdtest.Start(c.t, name, "ip", append([]string{"netns", "exec", c.nodes[h].ns, bin}, args...)...)
	c.procs[name] = p
	return p
}

func (c *cluster) etcdEndpoints() string {
	return subnet + "11:2379," + subnet + "12:2379," + subnet + "13:2379"
}

// startEtcd starts the three members and waits until the cluster answers.
func (c *cluster) startEtcd() {
	c.t.Helper()
	var initial []string
	for _, e := range []string{"e1", "e2", "e3"} {
		initial = append(initial, e+"=http://"+c.nodes[e].ip+":2380")
	}
	for _, e := range []string{"e1", "e2", "e3"} {
		ip := c.nodes[e].ip
		c.start(e, e, etcdtest.Binary(), "--name", e, "--data-dir", filepath.Join(c.dir, e),
			"--listen-client-urls", "http://"+ip+":2379", "--advertise-client-urls", "http://"+ip+":2379",
			"--listen-peer-urls", "http://"+ip+":2380", "--initial-advertise-peer-urls", "http://"+ip+":2380",
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--initial-cluster-token", c.id,
			"--max-txn-ops", "4200", "--logger", "zap", "--log-level", "warn")
	}
	cli := c.etcd()
	memdtest.Eventually(c.t, 30*time.Second, "etcd cluster answering", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Put(ctx, prefix+"/probe", "1")
		return err
	})
}

// etcd returns a client of the cluster, dialling from the observer.
func (c *cluster) etcd() *clientv3.Client {
	c.t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: strings.Split(c.etcdEndpoints(), ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialIn(c.nodes["ob"].nsPath())(ctx, "tcp", addr)
		})},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

func (c *cluster) coordList() string {
	var urls []string
	for _, id := range c.coords {
		urls = append(urls, c.coordURL(id))
	}
	return strings.Join(urls, ",")
}

// startCoordinators starts c1..cN (--role coordinator on etcd).
func (c *cluster) startCoordinators(n int) {
	c.t.Helper()
	for i := 1; i <= n; i++ {
		c.coords = append(c.coords, fmt.Sprintf("c%d", i))
	}
	for _, id := range c.coords {
		c.startCoordinator(id)
	}
	c.waitLeader("", 30*time.Second)
}

func (c *cluster) startCoordinator(id string) *memdtest.Proc {
	ip := c.nodes[id].ip
	return c.start(id, id, filepath.Join(c.bin, "memd"), "serve", "--role", "coordinator", "--id", id,
		"--listen", ip+":7480", "--advertise-url", c.coordURL(id), "--token", token,
		"--store", "etcd://"+c.etcdEndpoints()+prefix, "--election-ttl", electionTTL.String(), "--etcd-max-txn-ops", "4200",
		"--slab-size", slabSize, "--heartbeat-timeout", hbTimeout.String(), "--sweep-interval", "200ms",
		"--runtime-dir", filepath.Join(c.dir, "run-"+id), "--coordinator", c.coordList())
}

// startServers starts memory servers s1..sN (256 MiB each).
func (c *cluster) startServers(n int) {
	c.t.Helper()
	for i := 1; i <= n; i++ {
		c.startServer(fmt.Sprintf("s%d", i), "256MiB")
	}
	c.waitServersUp(n)
}

// startServer starts memory server id donating capacity.
func (c *cluster) startServer(id, capacity string) {
	c.t.Helper()
	ip := c.nodes[id].ip
	args := []string{"serve", "--role", "server", "--id", id, "--listen", ip + ":7480", "--token", token,
		"--coordinator", c.coordList(), "--tcp-listen", ip + ":7481", "--shm-socket", "off",
		"--capacity", capacity, "--slab-size", slabSize, "--heartbeat-interval", "500ms",
		"--runtime-dir", filepath.Join(c.dir, "run-"+id), memdtest.MlockFlag(c.t, 256<<20)}
	if a := c.serverData(id); a != "" {
		args = append(args, "--tcp-advertise", a)
	}
	c.start(id, id, filepath.Join(c.bin, "memd"), args...)
}

// waitServersUp waits until the pool has n memory servers up.
func (c *cluster) waitServersUp(n int) {
	c.t.Helper()
	memdtest.Eventually(c.t, 30*time.Second, fmt.Sprintf("%d memory servers up", n), func() error {
		st, err := c.status()
		if err != nil {
			return err
		}
		if st.ServersUp != n {
			return fmt.Errorf("%d up", st.ServersUp)
		}
		return nil
	})
}

// on returns a client of the given coordinators only, from the observer.
func (c *cluster) on(ids ...string) *client.Client { return c.onFor(2*time.Second, ids...) }

// onFor is on with the client's RetryFor (negative: one attempt, no
// leader following).
func (c *cluster) onFor(retry time.Duration, ids ...string) *client.Client {
	c.t.Helper()
	var urls []string
	for _, id := range ids {
		urls = append(urls, "http://"+c.nodes[id].ip+":7480")
	}
	cl, err := client.New(strings.Join(urls, ","), client.Options{Token: token, Timeout: 3 * time.Second, RetryFor: retry,
		DialContext: dialIn(c.nodes["ob"].nsPath())})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(cl.CloseIdleConnections)
	return cl
}

func (c *cluster) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func (c *cluster) status() (pool.Status, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.on(c.coords...).Status(ctx)
}

// leaderOf asks coordinator id who leads.
func (c *cluster) leaderOf(id string) (string, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	cv, err := c.on(id).Coordinators(ctx)
	if err != nil {
		return "", err
	}
	if cv.Leader == nil {
		return "", fmt.Errorf("no leader (%s)", cv.Error)
	}
	return cv.Leader.ID, nil
}

// waitLeader waits until a coordinator other than not leads, as the
// others see it, and answers the pool's status; it returns it and how
// long that took.
func (c *cluster) waitLeader(not string, timeout time.Duration) (string, time.Duration) {
	c.t.Helper()
	var leader string
	took := memdtest.Eventually(c.t, timeout, "a leader coordinator answering", func() error {
		for _, id := range c.coords {
			if id == not {
				continue
			}
			l, err := c.leaderOf(id)
			if err != nil {
				return err
			}
			if l == not {
				return fmt.Errorf("%s still named leader by %s", not, id)
			}
			ctx, cancel := c.ctx()
			_, err = c.on(l).Status(ctx)
			cancel()
			if err != nil {
				return fmt.Errorf("leader %s: %w", l, err)
			}
			leader = l
			return nil
		}
		return fmt.Errorf("no coordinator to ask")
	})
	return leader, took
}

// partition drops, on host h, every packet to and from the hosts of
// others (nftables in h's namespace); heal undoes it.
func (c *cluster) partition(h string, others ...string) {
	c.t.Helper()
	var ips []string
	for _, o := range others {
		ips = append(ips, c.nodes[o].ip)
	}
	set := strings.Join(ips, ", ")
	rules := fmt.Sprintf(`table inet rmemha {
	chain in { type filter hook input priority 0; policy accept; ip saddr { %s } drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr { %s } drop; }
}
`, set, set)
	f := filepath.Join(c.dir, "nft-"+h)
	if err := os.WriteFile(f, []byte(rules), 0o600); err != nil {
		c.t.Fatal(err)
	}
	run(c.t, "ip", "netns", "exec", c.nodes[h].ns, "nft", "-f", f)
}

func (c *cluster) heal(h string) {
	c.t.Helper()
	run(c.t, "ip", "netns", "exec", c.nodes[h].ns, "nft", "delete", "table", "inet", "rmemha")
}

// linkDown takes host h's link down (a partition from every host), and
// linkUp brings it back.
func (c *cluster) linkDown(h string) {
	run(c.t, "ip", "-n", c.nodes[h].ns, "link", "set", "eth0", "down")
}
func (c *cluster) linkUp(h string) { run(c.t, "ip", "-n", c.nodes[h].ns, "link", "set", "eth0", "up") }

// program is `memagent run` of churn on a1, at 25% local memory with two
// replicas per slab.
type program struct {
	c      *cluster
	cmd    *exec.Cmd
	gate   string
	rounds int
	heap   int
	lines  chan string
	stdout strings.Builder
	stderr bytes.Buffer
	start  time.Time
	done   chan struct{}
	err    error
}

// startProgram starts churn for rounds rounds and returns once round 0 is
// done; the program then waits for release.
func (c *cluster) startProgram(rounds int, coordinators string) *program {
	return c.startProgramSized(heapMiB, rounds, coordinators)
}

// startProgramSized is startProgram with a heap of heap MiB (a power of
// two), 25% of it local.
func (c *cluster) startProgramSized(heap, rounds int, coordinators string) *program {
	return c.startProgramWith(heap, rounds, coordinators, "--replicas", "2")
}

// startProgramWith is startProgramSized with the agent's redundancy flags.
func (c *cluster) startProgramWith(heap, rounds int, coordinators string, redundancy ...string) *program {
	c.t.Helper()
	dir, err := os.MkdirTemp("", "chaos-a-") // short: socket paths are limited
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { os.RemoveAll(dir) })
	p := &program{c: c, gate: filepath.Join(dir, "go"), rounds: rounds, heap: heap, lines: make(chan string, 64), done: make(chan struct{})}
	args := []string{"netns", "exec", c.nodes["a1"].ns, filepath.Join(c.bin, "memagent"), "run",
		"--socket", filepath.Join(dir, "agent.sock"), "--local-mem", strconv.Itoa(heap/4) + "MiB", "--lease-ttl", leaseTTL,
		"--stats", "--log-level", "warn", "--coordinator", coordinators, "--token", token}
	args = append(append(args, redundancy...), "--", filepath.Join(c.bin, "churn"), strconv.Itoa(heap), strconv.Itoa(rounds), p.gate)
	p.cmd = exec.Command("ip", args...)
	pr, pw, err := os.Pipe()
	if err != nil {
		c.t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = pw, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	pw.Close()
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	c.t.Cleanup(func() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		if c.t.Failed() {
			c.t.Logf("--- memagent run stderr:\n%s", p.stderr.String())
		}
	})
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	select {
	case l := <-p.lines:
		p.stdout.WriteString(l + "\n")
		if !strings.HasPrefix(l, "round 0 ") {
			c.t.Fatalf("first line %q", l)
		}
	case <-time.After(runLimit):
		c.t.Fatalf("round 0 not done within %v:\n%s", runLimit, p.stderr.String())
	}
	return p
}

// release lets the program run its remaining rounds.
func (p *program) release() {
	if err := os.WriteFile(p.gate, nil, 0o644); err != nil {
		p.c.t.Fatal(err)
	}
}

// wait waits for the program and checks that it printed exactly what
// churn prints when every page comes back right; it returns the pages the
// agent reports lost and the run time.
func (p *program) wait() (int, time.Duration) {
	t := p.c.t
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(runLimit):
		t.Fatalf("the program did not finish within %v:\n%s", runLimit, p.stderr.String())
	}
	for l := range p.lines {
		p.stdout.WriteString(l + "\n")
	}
	elapsed := time.Since(p.start)
	if want := expected(p.heap, p.rounds); p.err != nil || p.stdout.String() != want {
		t.Fatalf("memagent run: %v\nstdout %q\nwant   %q\nstderr:\n%s", p.err, p.stdout.String(), want, p.stderr.String())
	}
	if strings.Contains(p.stderr.String(), "DATA RACE") {
		t.Errorf("the race detector found a data race in memagent:\n%s", p.stderr.String())
	}
	lost := lostPages(t, p.stderr.String())
	if lost != 0 {
		t.Errorf("the agent reports %d pages lost:\n%s", lost, p.stderr.String())
	}
	return lost, elapsed
}

// pat and expected mirror testdata/churn.c.
func pat(i, r uint64) uint64 { return (i*0x9E3779B97F4A7C15 + 1) ^ (r * 0xD1B54A32D192ED03) }

func expected(heap, rounds int) string {
	pages := uint64(heap) << 20 / 4096
	words := pages * 512
	var b strings.Builder
	for r := 0; r < rounds; r++ {
		n := words
		if r >= rounds/2 && r > 0 {
			n += words / 2
		}
		var sum uint64
		for i := uint64(0); i < n; i++ {
			sum += pat(i, uint64(r)) * (i | 1)
		}
		fmt.Fprintf(&b, "round %d %016x\n", r, sum)
	}
	return b.String()
}

// lostPages sums the LOST column of memagent run --stats.
func lostPages(t *testing.T, stderr string) int {
	t.Helper()
	return statsColumn(t, stderr, "LOST")
}

// statsColumn sums a column of the stats table in memagent's output
// (LOST is the last; BAD, the pages read that failed their checksum, the
// one before it).
func statsColumn(t *testing.T, stderr, col string) int {
	t.Helper()
	back := 1
	if col == "BAD" {
		back = 2
	}
	sc := bufio.NewScanner(strings.NewReader(stderr))
	header, lost, cols, rows := false, 0, 0, 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "PID" {
			// A row has a field per column; "PREFETCH HITS" is one.
			header = f[len(f)-1] == "LOST"
			cols = len(strings.Fields(strings.ReplaceAll(sc.Text(), "PREFETCH HITS", "PREFETCH-HITS")))
			continue
		}
		if header && len(f) == cols && isNumber(f[0]) { // a row, not the pool line
			n, err := strconv.Atoi(f[cols-back])
			if err != nil {
				t.Fatalf("stats row %q: %v", sc.Text(), err)
			}
			lost += n
			rows++
		}
	}
	if !header || rows == 0 {
		t.Fatalf("no stats table with a LOST column and rows in memagent's output:\n%s", stderr)
	}
	return lost
}

func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}

// leaseSlabs returns the agent lease's slabs (from the leader).
func (c *cluster) leaseSlabs() ([]pool.SlabView, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	cl := c.on(c.coords...)
	ls, err := cl.Leases(ctx)
	if err != nil {
		return nil, err
	}
	if len(ls) != 1 {
		return nil, fmt.Errorf("%d leases, want the agent's one", len(ls))
	}
	return cl.Slabs(ctx, client.SlabFilter{Lease: ls[0].ID})
}

// dataShardServers returns n servers holding data shards of the agent's
// erasure-coded slabs (a page is read from its data shard; parity only
// when that fails), in name order.
func (c *cluster) dataShardServers(n int) []string {
	c.t.Helper()
	slabs, err := c.leaseSlabs()
	if err != nil || len(slabs) == 0 {
		c.t.Fatalf("the agent's slabs: %v %v", slabs, err)
	}
	seen := map[string]bool{}
	var ids []string
	for _, s := range slabs {
		red, err := pool.ParseRedundancy(s.Layout)
		if err != nil {
			c.t.Fatalf("slab %d: layout %q: %v", s.ID, s.Layout, err)
		}
		for _, r := range s.Replicas {
			if id := string(r.Server); r.Shard < red.K && !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	sort.Strings(ids)
	if len(ids) < n {
		c.t.Fatalf("%d servers hold data shards (%v), want %d", len(ids), ids, n)
	}
	return ids[:n]
}

// busiestServer is the memory server holding the most first replicas of
// the agent's slabs (where it reads first).
func (c *cluster) busiestServer() string {
	c.t.Helper()
	slabs, err := c.leaseSlabs()
	if err != nil || len(slabs) == 0 {
		c.t.Fatalf("the agent's slabs: %v %v", slabs, err)
	}
	n := map[string]int{}
	for _, s := range slabs {
		n[string(s.Replicas[0].Server)]++
	}
	ids := make([]string, 0, len(n))
	for id := range n {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return n[ids[i]] > n[ids[j]] || n[ids[i]] == n[ids[j]] && ids[i] < ids[j] })
	c.t.Logf("%d slabs; first replicas per server %v", len(slabs), n)
	return ids[0]
}

// waitRepaired waits until every slab of the agent has two healthy
// replicas, none on victim.
func (c *cluster) waitRepaired(victim string, timeout time.Duration) time.Duration {
	c.t.Helper()
	return memdtest.Eventually(c.t, timeout, "two healthy replicas of every slab off "+victim, func() error {
		slabs, err := c.leaseSlabs()
		if err != nil {
			return err
		}
		for _, s := range slabs {
			ok := 0
			for _, r := range s.Replicas {
				if string(r.Server) != victim && r.State == "ok" {
					ok++
				}
			}
			if ok < 2 {
				return fmt.Errorf("slab %d: %+v", s.ID, s.Replicas)
			}
		}
		return nil
	})
}

// termHistory reads PREFIX/term's every version from etcd's history: the
// "EPOCH OWNER" of the term that made each write, in commit order.
func (c *cluster) termHistory() []string {
	c.t.Helper()
	cli := c.etcd()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now, err := cli.Get(ctx, prefix+"/term")
	if err != nil {
		c.t.Fatal(err)
	}
	if len(now.Kvs) == 0 {
		return nil
	}
	last := now.Kvs[0].ModRevision
	var out []string
	for wr := range cli.Watch(ctx, prefix+"/term", clientv3.WithRev(1)) {
		if err := wr.Err(); err != nil {
			c.t.Fatal(err)
		}
		for _, ev := range wr.Events {
			out = append(out, string(ev.Kv.Value))
			if ev.Kv.ModRevision >= last {
				return out
			}
		}
	}
	c.t.Fatalf("the watch of %s/term ended early: %v", prefix, ctx.Err())
	return out
}

// checkNoSplitBrain asserts that the writers' terms never interleave: once
// a term has written, no older term writes again, and each epoch has one
// owner.
func (c *cluster) checkNoSplitBrain() []string {
	c.t.Helper()
	hist := c.termHistory()
	var maxEpoch int64
	owner := map[int64]string{}
	var terms []string
	for i, h := range hist {
		e, who, _ := strings.Cut(h, " ")
		epoch, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			c.t.Fatalf("term record %q: %v", h, err)
		}
		if epoch < maxEpoch {
			c.t.Fatalf("split brain: write %d by epoch %d (%s) after a write by epoch %d: %v", i, epoch, who, maxEpoch, hist)
		}
		if o, ok := owner[epoch]; ok && o != who {
			c.t.Fatalf("epoch %d written by %s and %s", epoch, o, who)
		}
		if epoch > maxEpoch {
			terms = append(terms, h)
		}
		owner[epoch], maxEpoch = who, epoch
	}
	return terms
}

// held is a lease the test holds like an agent (renewing it every second
// through every coordinator) with slabs it allocated.
type held struct {
	c      *cluster
	lease  pool.LeaseID
	secret string // the lease's credential: its requests carry it
	slabs  []pool.SlabView
}

// holdLease creates a lease with 3 slabs of 2 replicas and renews it
// until the test ends.
func (c *cluster) holdLease() *held {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	cl := c.on(c.coords...)
	l, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "chaos-test", Node: "ob", PID: 1, TTL: pool.Duration(6 * time.Second)})
	if err != nil {
		c.t.Fatal(err)
	}
	slabs, err := cl.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 3, Replicas: 2})
	if err != nil {
		c.t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
			cl.Renew(rctx, l.ID, pool.RenewRequest{})
			rcancel()
		}
	}()
	c.t.Cleanup(func() { close(stop); <-done })
	return &held{c: c, lease: l.ID, secret: l.Secret, slabs: slabs}
}

// check asserts that the lease and its slabs are what they were, replica
// for replica and key for key.
func (h *held) check() {
	h.c.t.Helper()
	ctx, cancel := h.c.ctx()
	defer cancel()
	cl := h.c.on(h.c.coords...)
	cl.SetLeaseSecret(h.lease, h.secret)
	got, err := cl.LeaseSlabs(ctx, h.lease)
	if err != nil {
		h.c.t.Fatalf("the test's lease after the leader change: %v", err)
	}
	key := func(v []pool.SlabView) string {
		var b strings.Builder
		for _, s := range v {
			fmt.Fprintf(&b, "%d:", s.ID)
			for _, r := range s.Replicas {
				fmt.Fprintf(&b, "%s/%d/%s ", r.Server, r.Index, r.Key)
			}
		}
		return b.String()
	}
	if key(got) != key(h.slabs) {
		h.c.t.Fatalf("the lease's slabs changed across the leader change:\nbefore %s\nafter  %s", key(h.slabs), key(got))
	}
}

// checkServersUp asserts that the leader knows n memory servers, all up.
func (c *cluster) checkServersUp(n int) {
	c.t.Helper()
	memdtest.Eventually(c.t, 10*time.Second, fmt.Sprintf("%d memory servers up at the new leader", n), func() error {
		st, err := c.status()
		if err != nil {
			return err
		}
		if st.ServersUp != n || st.ServersDown != 0 {
			return fmt.Errorf("%d up, %d down", st.ServersUp, st.ServersDown)
		}
		return nil
	})
}
