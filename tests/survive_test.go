package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"rmem/pager/proto"
	"rmem/pool"
	"rmem/pool/client"
	"rmem/rdma"
	"rmem/tests/internal/memdtest"
)

// The survival suite (issue 18): each test kills, pauses or attacks one
// part of a running pool with real processes, checks what the program and
// the pool say afterwards, and adds a row to the table TestMain prints:
// what was injected, the outcome, the pages lost (0, or the SIGBUS the
// program was promised instead of zeros) and how long recovery took.

// survRow is one scenario's line of the table.
type survRow struct {
	scenario, injected, outcome, lost string
	recovery                          time.Duration
	failed                            bool
}

var (
	survMu   sync.Mutex
	survRows []survRow
)

// survived records a scenario's row; a failed test's row says so.
func survived(t *testing.T, r survRow) {
	t.Helper()
	t.Cleanup(func() {
		r.failed = t.Failed()
		survMu.Lock()
		survRows = append(survRows, r)
		survMu.Unlock()
	})
	t.Logf("%s: %s; %s, pages lost %s, recovery %v", r.scenario, r.injected, r.outcome, r.lost, r.recovery.Round(time.Millisecond))
}

// printSurvival prints the table of the scenarios that ran.
func printSurvival() {
	survMu.Lock()
	defer survMu.Unlock()
	if len(survRows) == 0 {
		return
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SCENARIO\tINJECTED\tOUTCOME\tPAGES LOST\tRECOVERY")
	for _, r := range survRows {
		rec := "-"
		if r.recovery > 0 {
			rec = r.recovery.Round(time.Millisecond).String()
		}
		outcome := r.outcome
		if r.failed {
			outcome = "FAILED: " + outcome
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.scenario, r.injected, outcome, r.lost, rec)
	}
	w.Flush()
}

// survProg is a test program started under the shim, talking to the agent
// at socket.
type survProg struct {
	cmd      *exec.Cmd
	out, err memdtest.SyncBuf
	done     chan struct{}
	waitFile string
}

// survPattern starts testdata/memagent/pattern over maHeapMiB under the
// shim: it writes its heap, says so, and reads it back once the test
// calls readBack.
func survPattern(t *testing.T, bin, socket string, env ...string) *survProg {
	t.Helper()
	p := &survProg{done: make(chan struct{}), waitFile: filepath.Join(t.TempDir(), "go")}
	p.cmd = exec.Command(filepath.Join(bin, "pattern"), fmt.Sprint(maHeapMiB), p.waitFile)
	p.cmd.Env = append(os.Environ(), append([]string{"LD_PRELOAD=" + filepath.Join(bin, "librmem.so"),
		proto.EnvSocket + "=" + socket}, env...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	memdtest.Eventually(t, 60*time.Second, "the program wrote its heap", func() error {
		if strings.HasPrefix(p.out.String(), "written") {
			return nil
		}
		select {
		case <-p.done:
			t.Fatalf("the program exited before writing its heap: %v\nstderr: %s", p.cmd.ProcessState, p.err.String())
		default:
		}
		return errors.New("not yet")
	})
	return p
}

// readBack lets the program read its heap back.
func (p *survProg) readBack(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(p.waitFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wait waits up to limit for the program's end and returns how it ended.
func (p *survProg) wait(t *testing.T, limit time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState
	case <-time.After(limit):
		t.Fatalf("the program did not end within %v (it hangs)\nstdout: %s\nstderr: %s", limit, p.out.String(), p.err.String())
		return nil
	}
}

// endExact lets the program read its heap back and fails unless it ends
// with every word right.
func (p *survProg) endExact(t *testing.T, after string) {
	t.Helper()
	p.readBack(t)
	ps := p.wait(t, maRunLimit)
	if last := lastLine(p.out.String()); !ps.Success() || last != survChecksum() {
		t.Fatalf("%s the program ended %v with %q, want %q\nstderr: %s", after, ps, last, survChecksum(), p.err.String())
	}
}

// endSIGBUS lets the program read its heap back and fails unless it gets
// SIGBUS before it prints a checksum; it returns how long that took.
func (p *survProg) endSIGBUS(t *testing.T, after string) time.Duration {
	t.Helper()
	start := time.Now()
	p.readBack(t)
	ps := p.wait(t, maRunLimit)
	took := time.Since(start)
	if ws, ok := ps.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGBUS {
		t.Fatalf("%s the program ended %v, want SIGBUS\nstdout: %s\nstderr: %s", after, ps, p.out.String(), p.err.String())
	}
	if strings.Contains(p.out.String(), "checksum") {
		t.Fatalf("%s the program printed a checksum: %s", after, p.out.String())
	}
	return took
}

// survRig is a pool, an agent in a dir of its own and the pattern program
// under it with most of its heap in the pool.
type survRig struct {
	bin, dir string
	pool     *maPool
	agent    *maAgent
	prog     *survProg
}

// survStart starts a pool of servers memds, `memagent serve` with
// agentFlags, and the pattern program with progEnv, and waits until the
// program's pages are in the pool.
func survStart(t *testing.T, servers int, agentFlags, progEnv []string) *survRig {
	t.Helper()
	maNeeds(t)
	r := &survRig{bin: maBuild(t), pool: maStartPool(t, servers), dir: maAgentDir(t)}
	r.serve(t, agentFlags...)
	r.prog = survPattern(t, r.bin, r.agent.socket, progEnv...)
	survPaged(t, r.agent)
	return r
}

// serve starts `memagent serve` in the rig's dir (after one that died
// there: it takes over).
func (r *survRig) serve(t *testing.T, flags ...string) {
	t.Helper()
	r.agent = maServeIn(t, r.dir, filepath.Join(r.bin, "memagent"), r.pool, flags...)
}

// waitServed waits for the rig's (new) agent to serve its program, with
// pages in the pool.
func (r *survRig) waitServed(t *testing.T) {
	t.Helper()
	memdtest.Eventually(t, 30*time.Second, "the new agent serves the program", func() error {
		st, err := r.agent.stats(t)
		if err != nil {
			return err
		}
		if len(st.Clients) != 1 || st.Clients[0].RemoteBytes == 0 {
			return fmt.Errorf("clients %+v", st.Clients)
		}
		return nil
	})
}

// survChecksum is the last line pattern prints when every word is right.
func survChecksum() string {
	return fmt.Sprintf("checksum %016x", maSum(uint64(maPages)*512, 0))
}

// survPaged waits until the agent has evicted some of the program's heap to
// the pool (its pages live there, not only in its memory).
func survPaged(t *testing.T, a *maAgent) {
	t.Helper()
	memdtest.Eventually(t, 30*time.Second, "the program's pages in the pool", func() error {
		st, err := a.stats(t)
		if err != nil {
			return err
		}
		if len(st.Clients) != 1 || st.Clients[0].RemoteBytes < 8<<20 {
			return fmt.Errorf("clients %+v", st.Clients)
		}
		return nil
	})
}

// kill -9 of `memagent serve` while its program has most of its heap in
// the pool, and a new agent on the same socket and state dir: the program
// resumes with it and reads back every word.
func TestSurviveAgentKilled(t *testing.T) {
	r := survStart(t, 1, nil, nil)
	r.agent.proc.Kill()
	time.Sleep(time.Second) // the program faults with no agent meanwhile
	start := time.Now()
	r.serve(t)
	r.waitServed(t)
	recovery := time.Since(start)
	r.prog.endExact(t, "after the agent's restart")
	survived(t, survRow{scenario: "agent killed, restarted", injected: "kill -9 memagent serve mid-run, a new one 1s later",
		outcome: "resumed, exact checksum", lost: "0", recovery: recovery})
}

// kill -9 of `memagent serve` while its program faults (reading its heap
// back): faults the dead agent had read from the uffd but not answered are
// never delivered again, so the new agent wakes every thread that waits on
// one (it faults again, to the new agent). Without that wake the program
// slept in the kernel for good (check 11: 1 run in 3).
func TestSurviveAgentKilledMidFault(t *testing.T) {
	r := survStart(t, 1, nil, nil)
	st, err := r.agent.stats(t)
	if err != nil {
		t.Fatal(err)
	}
	reads := st.Clients[0].RemoteReads
	r.prog.readBack(t)
	memdtest.Eventually(t, 30*time.Second, "the program faults on its pages in the pool", func() error {
		st, err := r.agent.stats(t)
		if err != nil {
			return err
		}
		if len(st.Clients) != 1 || st.Clients[0].RemoteReads < reads+64 {
			return fmt.Errorf("clients %+v", st.Clients)
		}
		return nil
	})
	r.agent.proc.Kill()
	start := time.Now()
	r.serve(t)
	ps := r.prog.wait(t, maRunLimit)
	recovery := time.Since(start)
	if last := lastLine(r.prog.out.String()); !ps.Success() || last != survChecksum() {
		t.Fatalf("after the agent's restart mid-fault the program ended %v with %q, want %q\nstderr: %s", ps, last, survChecksum(), r.prog.err.String())
	}
	survived(t, survRow{scenario: "agent killed mid-fault, restarted", injected: "kill -9 memagent serve while its program reads its heap back, a new one at once",
		outcome: "resumed, exact checksum", lost: "0", recovery: recovery})
}

// kill -9 of `memagent serve` and no agent after it: the program's faults
// on pages in the pool wait RMEM_AGENT_WAIT, then it gets SIGBUS (never
// zeros, never an endless hang).
func TestSurviveAgentGone(t *testing.T) {
	const wait = 3 * time.Second
	r := survStart(t, 1, nil, []string{proto.EnvAgentWait + "=" + wait.String()})
	r.agent.proc.Kill()
	took := r.prog.endSIGBUS(t, "with no agent ("+wait.String()+" to wait)")
	if !strings.Contains(r.prog.err.String(), "agent") {
		t.Errorf("the program's stderr does not say why: %q", r.prog.err.String())
	}
	survived(t, survRow{scenario: "agent killed, none after", injected: "kill -9 memagent serve, " + proto.EnvAgentWait + "=" + wait.String(),
		outcome: "SIGBUS with a message", lost: "SIGBUS", recovery: took})
}

// kill -9 of `memagent run` (a private agent): its program is killed with
// it (PR_SET_PDEATHSIG), and the pool frees the dead lease's slabs when
// its TTL runs out; the next run removes the stale socket.
func TestSurviveRunKilled(t *testing.T) {
	maNeeds(t)
	bin := maBuild(t)
	p := maStartPool(t, 1)
	sockDir := maAgentDir(t)
	waitFile := filepath.Join(t.TempDir(), "go")
	args := append([]string{"run", "--socket", filepath.Join(sockDir, "agent.sock"), "--lease-ttl", "2s", "--local-mem", maLocalMem},
		p.args()...)
	run := memdtest.Start(t, "memagent run", filepath.Join(bin, "memagent"),
		append(args, "--", filepath.Join(bin, "pattern"), fmt.Sprint(maHeapMiB), waitFile)...)
	var child int
	memdtest.Eventually(t, 60*time.Second, "the program written, its pages in the pool", func() error {
		if run.Exited() {
			t.Fatalf("memagent run exited:\n%s", run.Output())
		}
		if !strings.Contains(run.Output(), "written") {
			return errors.New("not written yet")
		}
		child = childOf(run.Pid())
		if child == 0 {
			return errors.New("no child")
		}
		return survUsedSlabs(p, 1)
	})
	run.Kill()
	start := time.Now()
	memdtest.Eventually(t, 10*time.Second, "the program killed with its agent", func() error {
		if err := syscall.Kill(child, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); bytes.Contains(st, []byte(") Z ")) {
			return nil // a zombie until init reaps it
		}
		return fmt.Errorf("pid %d still runs", child)
	})
	killed := time.Since(start)
	memdtest.Eventually(t, 30*time.Second, "the dead lease's slabs freed", func() error { return survUsedSlabs(p, 0) })
	freed := time.Since(start)
	stale, _ := filepath.Glob(filepath.Join(sockDir, "memagent-run-*.sock"))
	r := maExec(t, nil, filepath.Join(bin, "memagent"), append(append([]string{"run", "--socket", filepath.Join(sockDir, "agent.sock"),
		"--local-mem", maLocalMem}, p.args()...), "--", "true")...)
	if r.code != 0 {
		t.Fatalf("the next memagent run: exit %d\n%s", r.code, r.stderr)
	}
	for _, s := range stale {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("the next run left the dead run's socket %s", s)
		}
	}
	survived(t, survRow{scenario: "memagent run killed", injected: "kill -9 memagent run mid-run (--lease-ttl 2s)",
		outcome: fmt.Sprintf("program killed in %v, slabs freed, socket removed", killed.Round(10*time.Microsecond)), lost: "- (died with it)", recovery: freed})
}

// childOf returns a child of pid (0: none), forked by any of its threads.
func childOf(pid int) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var c int
		if fmt.Sscan(string(b), &c); c != 0 {
			return c
		}
	}
	return 0
}

// survUsedSlabs fails unless the pool's slabs are (at least, for want > 0)
// want.
func survUsedSlabs(p *maPool, want int) error {
	slabs, err := maSlabs(p)
	if err != nil {
		return err
	}
	if (want == 0 && len(slabs) != 0) || len(slabs) < want {
		return fmt.Errorf("%d slabs allocated", len(slabs))
	}
	return nil
}

// Every memory server killed while the program has most of its heap in
// the pool: its next fault on a pooled page waits --fault-timeout, then the
// program gets SIGBUS.
func TestSurvivePoolLost(t *testing.T) {
	const bound = 5 * time.Second
	r := survStart(t, 2, []string{"--fault-timeout", bound.String()}, nil)
	for _, s := range r.pool.servers {
		s.Kill()
	}
	took := r.prog.endSIGBUS(t, "with the pool gone (--fault-timeout "+bound.String()+")")
	out := r.agent.proc.Output()
	if n := strings.Count(out, "goroutine "); n > 0 {
		t.Errorf("the agent logged %d goroutine stacks for an expected condition:\n%s", n, out)
	}
	survived(t, survRow{scenario: "pool lost", injected: "kill -9 of every memd (--fault-timeout " + bound.String() + ")",
		outcome: "SIGBUS", lost: "SIGBUS", recovery: took})
}

// Hostile input on every data plane of live memory servers, fresh (no key
// issued), in use (a program paging through it, and keys of a lease the
// test holds) and restarted (agents' old keys dead): raw garbage, frames
// with bad headers, and well-formed requests with wrong keys, offsets and
// lengths, over tcp and shm. The servers stay up, the program's pages and
// the test's own slab stay exact.
func TestSurviveHostileInput(t *testing.T) {
	maNeeds(t)
	bin := maBuild(t)
	memd := memdtest.Build(t)
	dir := t.TempDir()
	// busy: coordinator and server, tcp and shm; fresh: a pool of its own
	// that never issues a key.
	listen := map[string]string{"busy": memdtest.FreeAddr(t), "fresh": memdtest.FreeAddr(t)}
	start := func(id string) *memdtest.Proc {
		return memdtest.Start(t, id, memd, "serve", "--id", id, "--listen", listen[id], "--token", memdToken,
			"--tcp-listen", "127.0.0.1:0", "--shm-socket", filepath.Join(dir, id+"-shm.sock"),
			"--data-dir", filepath.Join(dir, "data-"+id), "--runtime-dir", filepath.Join(dir, "run-"+id),
			"--capacity", "256MiB", "--slab-size", "16MiB", memdtest.MlockFlag(t, 256<<20))
	}
	busy, fresh := start("busy"), start("fresh")
	url := func(id string) string { return "http://" + listen[id] }
	busyURL := url("busy")
	p := &maPool{url: busyURL, memd: memd, servers: map[string]*memdtest.Proc{"busy": busy}}
	addrs := func(u string) map[string]string {
		var got map[string]string
		memdtest.Eventually(t, 30*time.Second, "a server up at "+u, func() error {
			cl, err := client.New(u, client.Options{Token: memdToken, Timeout: 5 * time.Second})
			if err != nil {
				return err
			}
			defer cl.CloseIdleConnections()
			ss, err := cl.Servers(context.Background())
			if err != nil || len(ss) != 1 || ss[0].State != "up" {
				return fmt.Errorf("%v %+v", err, ss)
			}
			got = ss[0].Addrs
			return nil
		})
		return got
	}
	busyAddrs, freshAddrs := addrs(busyURL), addrs(url("fresh"))

	a := maServeIn(t, maAgentDir(t), filepath.Join(bin, "memagent"), p)
	prog := survPattern(t, bin, a.socket)
	survPaged(t, a)

	// A slab of the test's own, with its key: the attacks must not
	// change it, and in-bounds requests with its key flipped must fail.
	ctx := context.Background()
	cl, err := client.New(busyURL, client.Options{Token: memdToken, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.CloseIdleConnections()
	lease, err := cl.CreateLease(ctx, pool.CreateLeaseRequest{Agent: "survive", Node: "test", PID: os.Getpid(), TTL: pool.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	slabs, err := cl.Allocate(ctx, lease.ID, pool.AllocateRequest{Slabs: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	key, err := rdma.ParseKey(string(slabs[0].Replicas[0].Key))
	if err != nil {
		t.Fatal(err)
	}
	mine := make([]byte, 64<<10)
	rand.NewChaCha8([32]byte{18}).Read(mine)
	own, err := rdma.Dial(ctx, "tcp", slabs[0].Replicas[0].Addrs["tcp"], rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if err := rdma.Write(ctx, own, key, 0, mine); err != nil {
		t.Fatal(err)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 18))
	attacks := 0
	hit := func(what string, addrs map[string]string, keys []rdma.Key) {
		n := survAttack(t, rng, addrs, keys)
		attacks += n
		t.Logf("%s: %d hostile requests", what, n)
	}
	flipped := key
	flipped[rng.IntN(len(flipped))] ^= 1 << rng.IntN(8)
	hit("fresh server", freshAddrs, nil)
	hit("busy server", busyAddrs, []rdma.Key{flipped})
	fresh.Kill()
	fresh = start("fresh") // restarted: its data dir says it had a pool
	freshAddrs = addrs(url("fresh"))
	hit("restarted server", freshAddrs, nil)

	for name, s := range map[string]*memdtest.Proc{"busy": busy, "fresh": fresh} {
		if s.Exited() {
			t.Fatalf("memd %s died under hostile input:\n%s", name, s.Output())
		}
		if strings.Contains(s.Output(), "panic") || strings.Contains(s.Output(), "goroutine ") {
			t.Errorf("memd %s logged a panic or a stack:\n%s", name, s.Output())
		}
	}
	back := make([]byte, len(mine))
	if err := rdma.Read(ctx, own, key, 0, back); err != nil || !bytes.Equal(back, mine) {
		t.Fatalf("the test's own slab after the attacks: %v, equal %v", err, bytes.Equal(back, mine))
	}
	prog.endExact(t, "beside the attacks")
	survived(t, survRow{scenario: "hostile data-plane input", injected: fmt.Sprintf("%d frames: garbage, bad headers, wrong keys/offsets/lengths (tcp, shm; fresh, busy, restarted)", attacks),
		outcome: "servers up, program exact", lost: "0"})
}

// survAttack sends hostile input to every data plane in addrs: raw bytes,
// frames with valid hellos and random headers, and well-formed requests
// through the providers' own clients with random keys (and keys, nearly
// right, from the caller) at random offsets and lengths. It returns how
// many it sent; every request must fail or be refused, never crash.
func survAttack(t *testing.T, rng *rand.Rand, addrs map[string]string, keys []rdma.Key) int {
	t.Helper()
	n := 0
	ctx := context.Background()
	for network, addr := range addrs {
		if network != "tcp" && network != "shm" {
			continue
		}
		kind := map[string]string{"tcp": "tcp", "shm": "unixpacket"}[network]
		hello := survHello(network)
		for i := 0; i < 300; i++ {
			nc, err := net.DialTimeout(kind, addr, 2*time.Second)
			if err != nil {
				t.Fatalf("%s data plane at %s: %v", network, addr, err)
			}
			var frame []byte
			switch i % 3 {
			case 0: // garbage
				frame = make([]byte, 1+rng.IntN(300))
				for j := range frame {
					frame[j] = byte(rng.Uint32())
				}
			case 1: // a hello, then a random header
				frame = append(append([]byte{}, hello...), make([]byte, 24+rng.IntN(64))...)
				for j := len(hello); j < len(frame); j++ {
					frame[j] = byte(rng.Uint32())
				}
			case 2: // a hello, then a header of the right shape with a random key
				frame = append(append([]byte{}, hello...), survHeader(network, rng)...)
			}
			nc.SetDeadline(time.Now().Add(200 * time.Millisecond))
			nc.Write(frame)
			var b [256]byte
			nc.Read(b[:])
			nc.Close()
			n++
		}
		c, err := rdma.Dial(ctx, network, addr, rdma.DialOptions{})
		if err != nil {
			t.Fatalf("dial %s %s: %v", network, addr, err)
		}
		buf := make([]byte, rdma.MaxTransfer)
		for i := 0; i < 300; i++ {
			k, _ := rdma.NewKey()
			if len(keys) > 0 && i%2 == 0 {
				k = keys[rng.IntN(len(keys))]
			}
			off := rng.Uint64() >> rng.IntN(64)
			l := 1 + rng.IntN(len(buf))
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			switch i % 4 {
			case 0:
				err = rdma.Read(cctx, c, k, off, buf[:l])
			case 1:
				err = rdma.Write(cctx, c, k, off, buf[:l])
			case 2:
				_, err = rdma.CompareAndSwap(cctx, c, k, off&^7, rng.Uint64(), rng.Uint64())
			case 3:
				_, err = rdma.FetchAdd(cctx, c, k, off&^7, rng.Uint64())
			}
			cancel()
			n++
			if err == nil {
				c.Close()
				t.Fatalf("%s: a request with a wrong key at offset %d, %d bytes, was served", network, off, l)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				c.Close()
				t.Fatalf("%s: a hostile request got no answer in 5s", network)
			}
			if !survRefused(err) {
				// The server may drop the connection: dial again.
				c.Close()
				if c, err = rdma.Dial(ctx, network, addr, rdma.DialOptions{}); err != nil {
					t.Fatalf("dial %s %s again: %v", network, addr, err)
				}
			}
		}
		c.Close()
	}
	return n
}

// survHello is a valid hello of the provider's raw protocol (rdma/tcp's
// wire.go, rdma/shm's proto.go).
func survHello(network string) []byte {
	if network == "tcp" {
		return []byte("RMRD\x01\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00") // version 1, max transfer 1 MiB
	}
	return []byte("RMSH\x01\x00\x00\x00") // version 1
}

// survHeader is a request header of the provider's shape with a random
// opcode, length, key and offset.
func survHeader(network string, rng *rand.Rand) []byte {
	var key [16]byte
	for i := range key {
		key[i] = byte(rng.Uint32())
	}
	if network == "tcp" {
		b := make([]byte, 56)
		b[0], b[1] = 1, byte(rng.IntN(8))
		binary.LittleEndian.PutUint32(b[4:], rng.Uint32()>>rng.IntN(32))
		binary.LittleEndian.PutUint64(b[8:], rng.Uint64())
		copy(b[16:32], key[:])
		binary.LittleEndian.PutUint64(b[32:], rng.Uint64()>>rng.IntN(64))
		return b
	}
	b := make([]byte, 24)
	b[0] = byte(1 + rng.IntN(3))
	binary.LittleEndian.PutUint32(b[4:], rng.Uint32()>>rng.IntN(32))
	copy(b[8:24], key[:])
	return b
}

// survRefused reports whether err is a server's refusal of one request
// (the connection stays usable), not a dropped connection.
func survRefused(err error) bool {
	for _, e := range []error{rdma.ErrUnknownKey, rdma.ErrRevokedKey, rdma.ErrOutOfBounds, rdma.ErrPermission,
		rdma.ErrMisaligned, rdma.ErrInvalidRequest} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// kill -9 of `memagent serve --redundancy ec:2+1` while its program has
// most of its heap in erasure-coded slabs: the new agent takes over the
// lease with the slabs' shards in place and their sums (the pool keeps
// each replica's shard), and the program reads back every word.
func TestSurviveAgentKilledErasureCoded(t *testing.T) {
	ec := []string{"--redundancy", "ec:2+1"}
	r := survStart(t, 3, ec, nil)
	if st, err := r.agent.stats(t); err != nil || st.Redundancy != "ec:2+1" || st.Pool.StoredBytes == 0 {
		t.Fatalf("stats %+v, %v: want ec:2+1 and pages stored", st, err)
	}
	r.agent.proc.Kill()
	time.Sleep(time.Second)
	start := time.Now()
	r.serve(t, ec...)
	r.waitServed(t)
	recovery := time.Since(start)
	r.prog.endExact(t, "after the agent's restart, erasure-coded")
	survived(t, survRow{scenario: "agent killed, ec:2+1", injected: "kill -9 memagent serve --redundancy ec:2+1 mid-run, a new one 1s later",
		outcome: "resumed, exact checksum", lost: "0", recovery: recovery})
}
