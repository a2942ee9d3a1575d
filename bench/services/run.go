package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"rmem/bench/harness"
	"rmem/bench/loadgen"
	"rmem/internal/cgroup"
)

// server is a key-value server from Debian, run on a private Unix socket
// without persistence.
type server struct {
	name  string
	proto loadgen.Protocol
	argv  func(sock, dir string) []string
	ver   []string // the command that prints its version
}

var servers = map[string]*server{
	"redis": {name: "redis", proto: loadgen.Redis, ver: []string{"redis-server", "--version"},
		argv: func(sock, dir string) []string {
			return []string{"redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
				"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no"}
		}},
	"memcached": {name: "memcached", proto: loadgen.Memcached, ver: []string{"memcached", "-V"},
		argv: func(sock, _ string) []string {
			return []string{"memcached", "-u", "root", "-m", "2048", "-s", sock, "-a", "0700"}
		}},
}

func (s *server) version() string {
	out, err := exec.Command(s.ver[0], s.ver[1:]...).Output()
	if err != nil {
		return s.name + ": " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

type bench struct {
	o    options
	tmp  string
	md   *harness.Memd
	runs int
}

// proc is a server started under one configuration: the process to
// signal and wait for (the server itself, or memagent run), the server's
// pid, and the agent or cgroup around it.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	pid    int           // the server's
	group  *cgroup.Group // zram
	agent  *exec.Cmd     // rmem: memagent serve
	admin  string        // its admin socket
}

func (b *bench) runOnce(ctx context.Context, srv *server, config string, pct int, local uint64) (r Run) {
	r = Run{Server: srv.name, Config: config, Local: pct, LocalMiB: mib(local)}
	b.runs++
	dir := filepath.Join(b.tmp, fmt.Sprintf("%s-%s-%d-%d", srv.name, config, pct, b.runs))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.Outcome = "failed: " + err.Error()
		return r
	}
	ctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	sock := filepath.Join(dir, srv.name+".sock")
	p, err := b.start(ctx, srv, config, dir, sock, local)
	if p != nil {
		defer p.stop()
	}
	if err != nil {
		r.Outcome = "failed: " + err.Error()
		if strings.HasPrefix(err.Error(), "n/a") {
			r.Outcome = err.Error()
		}
		return r
	}
	err = b.drive(ctx, srv, p, sock, &r)
	switch {
	case r.Outcome == "WRONG VALUES": // whatever else happened
		fmt.Fprintf(os.Stderr, "services: %s under %s at %d%%: WRONG VALUES: %s\n", r.Server, r.Config, r.Local, describeBad(&r))
		if err != nil {
			r.Error = err.Error()
		}
	case p.group != nil && oomKilled(p.group):
		r.Outcome = "oom-killed"
	case err != nil && ctx.Err() != nil:
		r.Outcome = fmt.Sprintf("timed out: after %v: %v", b.o.timeout, err)
	case err != nil:
		r.Outcome = "failed: " + err.Error()
		if log := lastLines(filepath.Join(dir, "server.log"), 2); log != "" {
			r.Outcome += " (server log: " + log + ")"
		}
	default:
		r.Outcome = "ok"
	}
	return r
}

func oomKilled(g *cgroup.Group) bool {
	n, _ := g.OOMKills()
	return n > 0
}

// start starts srv under config and waits until it accepts connections.
func (b *bench) start(ctx context.Context, srv *server, config, dir, sock string, local uint64) (*proc, error) {
	argv := srv.argv(sock, dir)
	p := &proc{exited: make(chan struct{})}
	switch {
	case config == "local":
		p.cmd = exec.Command(argv[0], argv[1:]...)
	case config == "zram":
		// A cgroup of its own per run: one removed while the kernel still
		// holds swap charged to it lingers offline under its name.
		g, err := cgroup.Create(fmt.Sprintf("rmem-services-%d-%d", os.Getpid(), b.runs), local)
		if err != nil {
			return nil, fmt.Errorf("n/a: %w", err)
		}
		p.group = g
		if g.Version == cgroup.V1 {
			os.WriteFile(filepath.Join(g.Path, "memory.swappiness"), []byte("100"), 0)
		}
		p.cmd = g.Command(argv[0], argv[1:]...) // the shell execs the server: same pid
	case strings.HasPrefix(config, "rmem-"): // rmem-NETWORK[-it][-auto]
		network, auto := strings.CutSuffix(strings.TrimPrefix(config, "rmem-"), "-auto")
		network, inThread := strings.CutSuffix(network, "-it")
		budget := []string{"--local-mem", fmt.Sprint(local)}
		if auto {
			budget = []string{"--max-slowdown", b.o.maxSlowdown} // no --local-mem: the node's RAM is the ceiling
		}
		// memagent run with an agent of its own serves no admin socket,
		// so the agent is a memagent serve of the run's own, whose stats
		// can be read while the server runs; memagent run hands the
		// server to it with the same budget.
		agentSock, admin := filepath.Join(dir, "agent.sock"), filepath.Join(dir, "agent-admin.sock")
		serve := append([]string{"serve", "--coordinator", b.md.URL, "--token-file", b.md.TokenFile, "--socket", agentSock,
			"--admin-socket", admin, "--network", network, "--state-dir", "none", "--log-format", "json"}, budget...)
		p.agent = exec.Command(filepath.Join(b.o.bin, "memagent"), serve...)
		if err := startLogged(p.agent, filepath.Join(dir, "agent.log")); err != nil {
			return nil, fmt.Errorf("memagent serve: %w", err)
		}
		p.admin = admin
		if err := waitFor(ctx, 30*time.Second, func() error { _, err := p.stats(ctx); return err }); err != nil {
			return p, fmt.Errorf("memagent serve did not start: %w (%s)", err, lastLines(filepath.Join(dir, "agent.log"), 1))
		}
		args := []string{"run", "--socket", agentSock, "--log-format", "json"}
		if !auto {
			args = append(args, "--local-mem", fmt.Sprint(local))
		}
		if inThread {
			args = append(args, "--in-thread")
		}
		p.cmd = exec.Command(filepath.Join(b.o.bin, "memagent"), append(append(args, "--"), argv...)...)
	}
	if err := startLogged(p.cmd, filepath.Join(dir, "server.log")); err != nil {
		return p, err
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	err := waitFor(ctx, 30*time.Second, func() error {
		select {
		case <-p.exited:
			return errors.New("exited")
		default:
		}
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		return p, fmt.Errorf("%s did not start: %w", srv.name, err)
	}
	p.pid = p.cmd.Process.Pid
	if p.agent != nil {
		if p.pid, err = childOf(p.cmd.Process.Pid); err != nil {
			return p, err
		}
	}
	return p, nil
}

func startLogged(cmd *exec.Cmd, logPath string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close() // the child has its own descriptor
	cmd.Stdout, cmd.Stderr = f, f
	return cmd.Start()
}

// waitFor calls try until it succeeds, ctx ends or limit passes.
func waitFor(ctx context.Context, limit time.Duration, try func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// childOf returns the pid of ppid's child (memagent run's program).
func childOf(ppid int) (int, error) {
	procs, err := procfs.AllProcs()
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PPID == ppid {
			return p.PID, nil
		}
	}
	return 0, fmt.Errorf("memagent run (pid %d) has no child", ppid)
}

// stop stops the server (memagent run passes the signal on), then its
// agent, and removes its cgroup.
func (p *proc) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
	if p.agent != nil && p.agent.Process != nil {
		p.agent.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.agent.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.agent.Process.Kill()
			<-done
		}
	}
	if p.group != nil {
		p.group.Remove(10 * time.Second)
	}
}

// agentStats is what the bench reads of memagent stats --json.
type agentStats struct {
	Clients []struct {
		PID         int     `json:"pid"`
		Faults      uint64  `json:"faults"`
		RemoteReads uint64  `json:"remote_reads"`
		RemoteBytes uint64  `json:"remote_bytes"`
		BudgetBytes uint64  `json:"budget_bytes"`
		StallPct    float64 `json:"stall_pct"`
	} `json:"clients"`
}

func (p *proc) stats(ctx context.Context) (agentStats, error) {
	var st agentStats
	out, err := exec.CommandContext(ctx, filepath.Join(filepath.Dir(p.agent.Path), "memagent"), "stats", "--json", "--admin-socket", p.admin).Output()
	if err != nil {
		return st, fmt.Errorf("memagent stats: %w", err)
	}
	err = json.Unmarshal(out, &st)
	return st, err
}

// snapshot is what a measured phase is the difference of, and (rmem) the
// agent's view of the server when it was taken.
type snapshot struct {
	server, agent, memd float64 // CPU seconds
	faults, remote, all uint64
	inPool, budget      uint64  // bytes
	stallPct            float64 // the controller's last step
}

func (b *bench) snap(ctx context.Context, p *proc) (s snapshot, err error) {
	if s.server, err = harness.ProcCPU(p.pid); err != nil {
		return s, fmt.Errorf("the server's CPU: %w", err)
	}
	switch {
	case p.group != nil:
		st, err := p.group.Stat()
		if err != nil {
			return s, err
		}
		s.faults, s.all = st["pgmajfault"], st["pgfault"]
	case p.agent != nil:
		if s.agent, err = harness.ProcCPU(p.agent.Process.Pid); err != nil {
			return s, fmt.Errorf("the agent's CPU: %w", err)
		}
		if s.memd, err = b.md.CPU(); err != nil {
			return s, fmt.Errorf("memd's CPU: %w", err)
		}
		st, err := p.stats(ctx)
		if err != nil {
			return s, err
		}
		for _, c := range st.Clients {
			s.faults += c.Faults
			s.remote += c.RemoteReads
			s.inPool += c.RemoteBytes
			s.budget += c.BudgetBytes
			s.stallPct = max(s.stallPct, c.StallPct)
		}
	}
	return s, nil
}

// drive loads the server, reads its footprint, sends the unmeasured pass
// and the measured phases.
func (b *bench) drive(ctx context.Context, srv *server, p *proc, sock string, r *Run) error {
	g, err := loadgen.Open(ctx, loadgen.Config{Protocol: srv.proto, Dial: loadgen.Dialer(sock), Keys: b.o.keys,
		ValueSize: b.o.valueSize, Conns: b.o.conns, Seed: 1})
	if err != nil {
		return err
	}
	defer g.Close()
	ld, err := g.Load(ctx)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	r.LoadPerSec = math.Round(ld.PerSecond())
	if st, err := procStatus(p.pid); err == nil {
		r.RSSMiB = mib(st.VmRSS)
	}
	keys := map[string]loadgen.Keys{}
	for _, d := range loadgen.Distributions {
		if keys[d], err = loadgen.NewKeys(d, b.o.keys, b.o.theta, 1); err != nil {
			return err
		}
	}
	// The unmeasured GETs: their values are checked all the same.
	r.Warmup = &Phase{Dist: "warm-up"}
	warm := func(d string, n int) error {
		if n <= 0 {
			return nil
		}
		res, err := g.Get(ctx, keys[d], n)
		w := r.Warmup
		w.Requests += res.Requests
		w.Wrong += res.Wrong
		w.Missing += res.Missing
		if w.FirstWrong == "" {
			w.FirstWrong = res.FirstWrong
		}
		if res.Bad() > 0 {
			r.Outcome = "WRONG VALUES"
		}
		if err != nil {
			return fmt.Errorf("%s warm-up: %w", d, err)
		}
		return nil
	}
	if err := warm("uniform", b.o.warmup); err != nil {
		return err
	}
	for _, d := range loadgen.Distributions {
		if d == "zipf" {
			// An -auto run's budget moves while it runs: the warm-up goes
			// on until it has had time to settle.
			for began := time.Now(); ; {
				if err := warm(d, b.o.zipfWarmup); err != nil {
					return err
				}
				if !strings.HasSuffix(r.Config, "-auto") || time.Since(began) >= b.o.settle || b.o.zipfWarmup <= 0 {
					break
				}
			}
		}
		s0, err := b.snap(ctx, p)
		if err != nil {
			return err
		}
		res, err := g.Get(ctx, keys[d], b.o.requests)
		if err != nil {
			return fmt.Errorf("GET %s: %w", d, err)
		}
		s1, err := b.snap(ctx, p)
		if err != nil {
			return err
		}
		r.Phases = append(r.Phases, *phase(d, &res, s0, s1))
		if res.Bad() > 0 {
			r.Outcome = "WRONG VALUES"
		}
		r.RemoteMiB, r.BudgetMiB, r.StallPct = mib(s1.inPool), mib(s1.budget), s1.stallPct
	}
	if st, err := procStatus(p.pid); err == nil {
		r.EndRSSMiB = mib(st.VmRSS)
	}
	return nil
}

func describeBad(r *Run) string {
	var s []string
	var ph []Phase
	if r.Warmup != nil {
		ph = append(ph, *r.Warmup)
	}
	for _, p := range append(ph, r.Phases...) {
		if p.Wrong+p.Missing > 0 {
			s = append(s, fmt.Sprintf("%s: %d wrong, %d missing of %d; first: %s", p.Dist, p.Wrong, p.Missing, p.Requests, p.FirstWrong))
		}
	}
	return strings.Join(s, "; ")
}

func phase(dist string, res *loadgen.Result, s0, s1 snapshot) *Phase {
	us := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)*10) / 10 }
	cpu := func(a, b float64) float64 { return math.Round((b-a)*100) / 100 } // clock ticks of 10 ms
	p := &Phase{Dist: dist, Requests: res.Requests, Seconds: math.Round(res.Elapsed.Seconds()*1000) / 1000,
		PerSecond: math.Round(res.PerSecond()), P50us: us(res.Latency.Quantile(0.5)), P99us: us(res.Latency.Quantile(0.99)),
		P999us: us(res.Latency.Quantile(0.999)), MaxUs: us(res.Latency.Max()),
		Wrong: res.Wrong, Missing: res.Missing, FirstWrong: res.FirstWrong,
		Misses: s1.faults - s0.faults, RemoteReads: s1.remote - s0.remote, AllFaults: s1.all - s0.all,
		ServerCPU: cpu(s0.server, s1.server), AgentCPU: cpu(s0.agent, s1.agent), MemdCPU: cpu(s0.memd, s1.memd)}
	if res.Requests > 0 {
		p.MissesPerOp = math.Round(float64(p.Misses)/float64(res.Requests)*1000) / 1000
	}
	return p
}

func procStatus(pid int) (procfs.ProcStatus, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procfs.ProcStatus{}, err
	}
	return p.NewStatus()
}

// lastLines returns the last n lines of a log, on one line.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	lines = lines[max(0, len(lines)-n):]
	return string(bytes.Join(lines, []byte(" | ")))
}
