// Command ec is part of make bench: the price of erasure-coded pages. It
// starts a coordinator and eight memory servers on this host (tcp on
// loopback), and runs a program that writes a 256 MiB heap and then reads
// random words of it at 32 MiB local, under memagent serve
// --redundancy rep:2, ec:6+2, and ec:6+2 with two of the eight servers
// killed (kill -9) between the writes and the reads: the servers of two
// data shards of its first slab (degraded reads: every page of a lost
// shard is rebuilt from its stripe). It reports the
// program's page faults as it sees them (p50, p99 of reads over 2 µs),
// the pool bytes per byte paged out (pool.stored_bytes / remote bytes),
// and the ratios to rep:2 of the same run, in docs/bench/ec.md.
//
// It needs root (memagent run), gcc and the binaries of make build. It is
// not a test: CI does not run it.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type result struct {
	Config   string
	Faults   int
	P50, P99 float64 // µs
	Stored   float64 // pool.stored_bytes / remote bytes
	Degraded uint64  // pages read from the rest of their stripe
	Err      string
}

func main() {
	out := flag.String("out", "docs/bench/ec.md", "report file")
	bin := flag.String("bin", "bin", "directory of memd, memagent and librmem.so")
	heap := flag.Int("heap", 256, "the program's heap, MiB")
	local := flag.Int("local", 32, "its local memory, MiB")
	runs := flag.Int("runs", 3, "runs of each configuration (the median p50 is reported)")
	flag.Parse()
	if err := run(*out, *bin, *heap, *local, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "bench/ec:", err)
		os.Exit(1)
	}
}

// pool is a coordinator and its memory servers.
type pool struct {
	dir, url, token string
	coord           *exec.Cmd
	servers         []*exec.Cmd
	bin             string
}

func start(bin, dir string, port int) (*pool, error) {
	p := &pool{dir: dir, bin: bin, url: fmt.Sprintf("http://127.0.0.1:%d", port), token: filepath.Join(dir, "run", "token")}
	p.coord = daemon(filepath.Join(dir, "coord.log"), filepath.Join(bin, "memd"), "serve", "--role", "coordinator", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--slab-size", "16MiB", "--data-dir", filepath.Join(dir, "coord"), "--runtime-dir", filepath.Join(dir, "run"), "--shm-socket", "off", "--tcp-listen", "off")
	if err := p.wait(0); err != nil {
		return p, err
	}
	for i := 1; i <= 8; i++ {
		sp := port + 10*i
		p.servers = append(p.servers, daemon(filepath.Join(dir, fmt.Sprintf("s%d.log", i)), filepath.Join(bin, "memd"), "serve", "--role", "server",
			"--id", fmt.Sprintf("s%d", i), "--coordinator", p.url, "--token-file", p.token, "--listen", fmt.Sprintf("127.0.0.1:%d", sp),
			"--tcp-listen", fmt.Sprintf("127.0.0.1:%d", sp+1), "--shm-socket", "off", "--capacity", "192MiB", "--slab-size", "16MiB",
			"--runtime-dir", filepath.Join(dir, fmt.Sprintf("run%d", i))))
	}
	return p, p.wait(8)
}

func daemon(log, bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	if f, err := os.Create(log); err == nil {
		cmd.Stdout, cmd.Stderr = f, f
		defer f.Close()
	}
	cmd.Start()
	return cmd
}

// wait waits for the coordinator to answer with n servers up.
func (p *pool) wait(n int) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		b, err := exec.Command(filepath.Join(p.bin, "memd"), "status", "--json", "--coordinator", p.url, "--token-file", p.token).Output()
		var st struct {
			Up int `json:"servers_up"`
		}
		if err == nil && json.Unmarshal(b, &st) == nil && st.Up >= n {
			return nil
		}
	}
	return fmt.Errorf("the pool did not come up with %d servers (see %s)", n, p.dir)
}

func (p *pool) stop() {
	for _, c := range append(p.servers, p.coord) {
		if c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}
}

// measure runs the program once under an agent keeping pages as red;
// with kill, two servers are killed between its writes and its reads.
func measure(p *pool, prog, red string, heap, local int, kill bool) result {
	r := result{Config: red}
	if kill {
		r.Config += ", two servers killed"
	}
	dir, err := os.MkdirTemp(p.dir, "run-")
	if err != nil {
		r.Err = err.Error()
		return r
	}
	sock, adm := filepath.Join(dir, "ag.sock"), filepath.Join(dir, "adm.sock")
	agent := daemon(filepath.Join(dir, "agent.log"), filepath.Join(p.bin, "memagent"), "serve", "--redundancy", red, "--local-mem", fmt.Sprintf("%dMiB", local),
		"--network", "tcp", "--coordinator", p.url, "--token-file", p.token, "--socket", sock, "--admin-socket", adm)
	defer func() { agent.Process.Signal(syscall.SIGTERM); agent.Wait() }()
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(adm); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd := exec.Command(filepath.Join(p.bin, "memagent"), "run", "--socket", sock, "--admin-socket", adm, "--", prog, fmt.Sprint(heap), dir)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		r.Err = err.Error()
		return r
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(filepath.Join(dir, "written")); err == nil {
			break
		}
		if i > 3000 {
			cmd.Process.Kill()
			cmd.Wait()
			r.Err = "the program did not write its heap"
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	r.Stored, _ = agentStats(p.bin, adm)
	if kill {
		for _, i := range dataServers(p) {
			p.servers[i].Process.Kill()
			p.servers[i].Wait()
		}
	}
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o644)
	err = cmd.Wait()
	_, r.Degraded = agentStats(p.bin, adm)
	if _, serr := fmt.Sscanf(stdout.String(), "%d %f %f", &r.Faults, &r.P50, &r.P99); err != nil || serr != nil {
		r.Err = fmt.Sprintf("%v %q", err, strings.TrimSpace(stdout.String()))
	}
	return r
}

// dataServers returns the indexes of the servers of data shards 0 and 1
// of the agent's first slab (so that a third of its pages are degraded;
// the other slabs' shards sit elsewhere, placed at random), or the first
// two if the pool does not say.
func dataServers(p *pool) []int {
	b, err := exec.Command(filepath.Join(p.bin, "memd"), "slabs", "--json", "--coordinator", p.url, "--token-file", p.token).Output()
	var slabs []struct {
		ID       uint64 `json:"id"`
		Replicas []struct {
			Server string `json:"server"`
			Shard  int    `json:"shard"`
		} `json:"replicas"`
	}
	if err != nil || json.Unmarshal(b, &slabs) != nil || len(slabs) == 0 {
		return []int{0, 1}
	}
	first := slabs[0]
	for _, s := range slabs {
		if s.ID < first.ID {
			first = s
		}
	}
	var out []int
	for _, r := range first.Replicas {
		var n int
		if _, err := fmt.Sscanf(r.Server, "s%d", &n); err == nil && r.Shard < 2 && n >= 1 && n <= len(p.servers) {
			out = append(out, n-1)
		}
	}
	if len(out) != 2 {
		return []int{0, 1}
	}
	return out
}

// agentStats reads pool.stored_bytes / remote bytes, and the degraded
// reads, from the agent's stats.
func agentStats(bin, adm string) (float64, uint64) {
	b, err := exec.Command(filepath.Join(bin, "memagent"), "stats", "--json", "--admin-socket", adm).Output()
	if err != nil {
		return 0, 0
	}
	var st struct {
		Clients []struct {
			Remote uint64 `json:"remote_bytes"`
		} `json:"clients"`
		Pool struct {
			Stored uint64 `json:"stored_bytes"`
		} `json:"pool"`
		IO struct {
			Degraded uint64 `json:"degraded_reads"`
		} `json:"io"`
	}
	if json.Unmarshal(b, &st) != nil {
		return 0, 0
	}
	var remote uint64
	for _, c := range st.Clients {
		remote += c.Remote
	}
	if remote == 0 {
		return 0, st.IO.Degraded
	}
	return float64(st.Pool.Stored) / float64(remote), st.IO.Degraded
}

func run(out, bin string, heap, local, runs int) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (memagent run)")
	}
	tmp, err := os.MkdirTemp("", "rmem-bench-ec-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	prog := filepath.Join(tmp, "reads")
	if b, err := exec.Command("gcc", "-O2", "-o", prog, "bench/workload/reads.c").CombinedOutput(); err != nil {
		return fmt.Errorf("gcc: %v: %s", err, b)
	}
	configs := []struct {
		red  string
		kill bool
	}{{"rep:2", false}, {"ec:6+2", false}, {"ec:6+2", true}}
	all := make([][]result, len(configs))
	for i := 0; i < runs; i++ {
		for c, cf := range configs {
			// A pool of its own per run: the degraded run kills two of
			// its servers.
			p, err := start(bin, filepath.Join(tmp, fmt.Sprintf("pool-%d-%d", i, c)), 27400)
			if err == nil {
				r := measure(p, prog, cf.red, heap, local, cf.kill)
				fmt.Printf("%-32s faults %6d p50 %6.1f us p99 %7.1f us stored/remote %.2f degraded %d %s\n", r.Config, r.Faults, r.P50, r.P99, r.Stored, r.Degraded, r.Err)
				all[c] = append(all[c], r)
			}
			p.stop()
			if err != nil {
				return err
			}
		}
	}
	return report(out, all, heap, local, runs)
}

// median returns the run with the median p50 (failed runs last).
func median(rs []result) result {
	ok := rs[:0:0]
	for _, r := range rs {
		if r.Err == "" {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return rs[0]
	}
	for i := range ok {
		for j := i + 1; j < len(ok); j++ {
			if ok[j].P50 < ok[i].P50 {
				ok[i], ok[j] = ok[j], ok[i]
			}
		}
	}
	return ok[len(ok)/2]
}

func report(out string, all [][]result, heap, local, runs int) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# Erasure-coded pages: the price of a miss\n\n")
	fmt.Fprintf(&b, "`make bench` (`go run ./bench/ec`), %s, on %s (%d CPUs). A program writes a %d MiB heap and reads 262,144 random words of it at %d MiB local, under `memagent serve --redundancy` over tcp, with a coordinator and eight memory servers on this host; \"two servers killed\" kills two of the eight (kill -9) between the writes and the reads, those of two data shards of the agent's first slab, so that every page of their shards is read from the rest of its stripe (degraded; the other slabs' shards are placed at random). Page faults as the program sees them (reads over 2 µs); the median p50 of %d runs of each, each on a pool of its own. `stored/remote` is `pool.stored_bytes` over the bytes paged out.\n\n",
		time.Now().UTC().Format("2006-01-02"), host, runtime.NumCPU(), heap, local, runs)
	fmt.Fprintf(&b, "| redundancy | faults | p50 µs | p99 µs | p50 / rep:2 | p99 / rep:2 | stored/remote | degraded reads |\n|---|---|---|---|---|---|---|---|\n")
	base := median(all[0])
	for _, rs := range all {
		r := median(rs)
		if r.Err != "" {
			fmt.Fprintf(&b, "| %s | failed: %s | | | | | | |\n", r.Config, r.Err)
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %.2fx | %.2fx | %.2f | %d |\n", r.Config, r.Faults, r.P50, r.P99, r.P50/base.P50, r.P99/base.P99, r.Stored, r.Degraded)
	}
	b.WriteString("\nEvery run read its heap back exactly (the program exits non-zero on a wrong word).\n")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}
