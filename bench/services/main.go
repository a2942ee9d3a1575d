// Command services is make bench-services: real servers whose memory is
// two to four times their local share, under the kernel's own swap and
// under rmem, judged as their users judge them: GETs per second and tail
// latency (docs/bench/services).
//
// For Redis and memcached (Debian's, on private Unix sockets, no
// persistence) it loads 1 KiB values with the project's load generator
// (bench/loadgen), measures the server's resident memory after loading
// all local, then sends one unmeasured pass of GETs and measures GETs with
// uniform and with Zipfian keys, every value checked. It does so all
// local; under the kernel's swap to zram with the server in a memory
// cgroup limited to the local share; and under memagent's userfaultfd
// pager over tcp and over shm, with a memd of its own; at 50% and 25% of
// the all-local footprint. Each run reports misses per request in its
// measured phases (zram: the cgroup's major faults; rmem: the program's
// faults from the agent's stats) and the CPU the server, the agent and
// memd took. A run that fails (an OOM kill, a timeout) is retried once
// and recorded as what it is, never as a rate; a wrong or missing value
// is never retried away.
//
// It needs root, zram, redis-server, memcached and the binaries of make
// build. It is not a test: CI does not run it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"rmem/bench/harness"
	"rmem/internal/cpuidle"
)

// Phase is one measured phase of GETs.
type Phase struct {
	Dist       string  `json:"dist"` // uniform or zipf
	Requests   uint64  `json:"requests"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"per_second"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	P999us     float64 `json:"p999_us"`
	MaxUs      float64 `json:"max_us"`
	Wrong      uint64  `json:"wrong,omitempty"`   // values that differ from the loaded ones
	Missing    uint64  `json:"missing,omitempty"` // keys the server did not have
	FirstWrong string  `json:"first_wrong,omitempty"`
	// Misses counts the server's page faults that brought a page back
	// during the phase: for zram the cgroup's pgmajfault, for rmem the
	// program's faults in the agent's stats (RemoteReads: those of them
	// read from the pool).
	Misses      uint64 `json:"misses"`
	RemoteReads uint64 `json:"remote_reads,omitempty"`
	// AllFaults (zram) is the cgroup's pgfault: every page fault of the
	// server, minor ones included, such as a page taken back from the
	// swap cache before it was freed (not in Misses).
	AllFaults   uint64  `json:"all_faults,omitempty"`
	MissesPerOp float64 `json:"misses_per_request"`
	ServerCPU   float64 `json:"server_cpu_seconds"`
	AgentCPU    float64 `json:"agent_cpu_seconds,omitempty"`
	MemdCPU     float64 `json:"memd_cpu_seconds,omitempty"`
}

// Run is one server under one configuration.
type Run struct {
	Server   string  `json:"server"`
	Config   string  `json:"config"`        // local, zram, rmem-tcp, rmem-shm
	Local    int     `json:"local_percent"` // of the all-local footprint
	LocalMiB float64 `json:"local_mib"`
	// Outcome is "ok", "WRONG VALUES", "oom-killed", "failed: ...",
	// "timed out: ..." or "n/a: ..." (the configuration cannot run here).
	Outcome string `json:"outcome"`
	// Retried is the outcome of a first attempt that did not finish (the
	// run was done again once).
	Retried string `json:"retried,omitempty"`
	// Error is what stopped a run that also read wrong values.
	Error      string  `json:"error,omitempty"`
	LoadPerSec float64 `json:"load_per_second,omitempty"`
	RSSMiB     float64 `json:"rss_after_load_mib,omitempty"` // the server's VmRSS
	Warmup     *Phase  `json:"warmup,omitempty"`             // the unmeasured pass (its checks count)
	Phases     []Phase `json:"phases,omitempty"`
	// Under rmem, at the end of the last phase (memagent stats): the
	// server's pages in the pool, its budget, the stall the controller
	// last saw (-auto), and its VmRSS.
	RemoteMiB float64 `json:"remote_mib,omitempty"`
	BudgetMiB float64 `json:"budget_mib,omitempty"`
	StallPct  float64 `json:"stall_pct,omitempty"`
	EndRSSMiB float64 `json:"end_rss_mib,omitempty"`
}

// Report is what make bench-services writes.
type Report struct {
	Date       string  `json:"date"`
	Host       string  `json:"host"`
	CPUs       int     `json:"cpus"`
	Kernel     string  `json:"kernel"`
	CPUIdle    string  `json:"cpuidle"`
	Load       string  `json:"load_before"` // /proc/loadavg when it started
	Keys       int     `json:"keys"`
	ValueSize  int     `json:"value_size"`
	Conns      int     `json:"conns"`
	Requests   int     `json:"requests"`        // measured GETs per distribution
	Warmup     int     `json:"warmup_requests"` // uniform GETs after loading, unmeasured
	ZipfWarmup int     `json:"zipf_warmup_requests"`
	Theta      float64 `json:"theta"`
	// MaxSlowdown is the -auto runs' target; SettleSecs how long their
	// Zipfian warm-up went on at least.
	MaxSlowdown string   `json:"max_slowdown,omitempty"`
	SettleSecs  float64  `json:"auto_settle_seconds,omitempty"`
	Versions    []string `json:"versions"`
	Minutes     float64  `json:"minutes"` // the whole run's
	Runs        []Run    `json:"runs"`
}

var configs = []string{"local", "zram", "rmem-tcp", "rmem-shm", "rmem-tcp-it", "rmem-shm-it"}

// autoConfigs run once per server, with no share: `memagent serve
// --max-slowdown` sets the budget (docs/pager.md, Budgets from a slowdown
// target), and the run reports what it moved out.
var autoConfigs = []string{"rmem-tcp-auto"}

func main() {
	var o options
	flag.StringVar(&o.out, "out", "docs/bench/services", "report directory")
	flag.StringVar(&o.bin, "bin", "bin", "directory of memd, memagent and librmem.so")
	servers := flag.String("servers", "redis,memcached", "servers to run, comma-separated")
	cfgs := flag.String("configs", strings.Join(append(configs, autoConfigs...), ","), "configurations to run, comma-separated (local always runs: it sets the local shares)")
	flag.StringVar(&o.maxSlowdown, "max-slowdown", "5%", "the slowdown target of the -auto configurations (memagent serve --max-slowdown)")
	flag.DurationVar(&o.settle, "auto-settle", time.Minute, "-auto configurations: how long the Zipfian warm-up goes on at least (in rounds of -zipf-warmup GETs), for the budget to settle")
	pcts := flag.String("local", "50,25", "local shares, percent of the all-local footprint, comma-separated")
	flag.IntVar(&o.keys, "keys", 216_000, "keys loaded")
	flag.IntVar(&o.valueSize, "value-size", 1024, "bytes of each value")
	flag.IntVar(&o.conns, "conns", 8, "client connections, one request at a time each")
	flag.IntVar(&o.requests, "requests", 150_000, "measured GETs per key distribution")
	flag.IntVar(&o.warmup, "warmup", -1, "uniform GETs after loading, not measured (-1: one per key)")
	flag.IntVar(&o.zipfWarmup, "zipf-warmup", 50_000, "Zipfian GETs before the measured ones, not measured")
	flag.Float64Var(&o.theta, "theta", 0.99, "the Zipfian distribution's theta")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "time limit of one run")
	from := flag.String("from", "", "write the report again from this results.json instead of running")
	flag.Parse()
	if *from != "" {
		if err := rewrite(*from, o.out); err != nil {
			fmt.Fprintln(os.Stderr, "services:", err)
			os.Exit(1)
		}
		return
	}
	if o.warmup < 0 {
		o.warmup = o.keys
	}
	o.servers, o.configs = strings.Split(*servers, ","), strings.Split(*cfgs, ",")
	for _, p := range strings.Split(*pcts, ",") {
		var v int
		if _, err := fmt.Sscan(p, &v); err != nil || v <= 0 || v >= 100 {
			fmt.Fprintf(os.Stderr, "services: -local %q: want percents between 1 and 99\n", *pcts)
			os.Exit(2)
		}
		o.pcts = append(o.pcts, v)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "services:", err)
		os.Exit(1)
	}
}

type options struct {
	out, bin, maxSlowdown                                string
	servers, configs                                     []string
	pcts                                                 []int
	keys, valueSize, conns, requests, warmup, zipfWarmup int
	theta                                                float64
	timeout, settle                                      time.Duration
}

func (o *options) has(config string) bool {
	for _, c := range o.configs {
		if c == config {
			return true
		}
	}
	return false
}

func run(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (memory cgroups, zram, userfaultfd)")
	}
	for _, s := range o.servers {
		if _, ok := servers[s]; !ok {
			return fmt.Errorf("unknown server %q (want redis or memcached)", s)
		}
	}
	began := time.Now()
	o.bin, _ = filepath.Abs(o.bin)
	tmp, err := os.MkdirTemp("", "rmem-services-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	rep := Report{Date: began.UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Keys: o.keys, ValueSize: o.valueSize,
		Conns: o.conns, Requests: o.requests, Warmup: o.warmup, ZipfWarmup: o.zipfWarmup, Theta: o.theta, MaxSlowdown: o.maxSlowdown, SettleSecs: o.settle.Seconds()}
	rep.Host, _ = os.Hostname()
	rep.Kernel = firstLine("/proc/sys/kernel/osrelease")
	rep.Load = firstLine("/proc/loadavg")
	if p, err := cpuidle.Read("/sys"); err == nil {
		rep.CPUIdle = p.String()
	}
	for _, s := range o.servers {
		rep.Versions = append(rep.Versions, servers[s].version())
	}
	var zerr error
	if o.has("zram") {
		var zramOff func()
		zramOff, zerr = harness.ZramOn()
		if zramOff != nil {
			defer zramOff()
		}
	}
	var md *harness.Memd
	if slices.ContainsFunc(o.configs, func(c string) bool { return strings.HasPrefix(c, "rmem-") }) {
		if md, err = harness.StartMemd(o.bin, tmp, 7494); err != nil {
			return err
		}
		defer md.Stop()
	}
	b := &bench{o: o, tmp: tmp, md: md}
	for _, s := range o.servers {
		srv := servers[s]
		base := b.attempts(ctx, srv, "local", 100, 0)
		rep.Runs = append(rep.Runs, base)
		if base.Outcome != "ok" || base.RSSMiB == 0 {
			continue // no footprint to take shares of
		}
		for _, pct := range o.pcts {
			local := uint64(base.RSSMiB*float64(pct)/100*(1<<20)) &^ 4095
			for _, c := range configs[1:] {
				if !o.has(c) {
					continue
				}
				var r Run
				if c == "zram" && zerr != nil {
					r = Run{Server: s, Config: c, Local: pct, LocalMiB: mib(local), Outcome: "n/a: " + zerr.Error()}
					logRun(r)
				} else {
					r = b.attempts(ctx, srv, c, pct, local)
				}
				rep.Runs = append(rep.Runs, r)
			}
		}
		for _, c := range autoConfigs {
			if o.has(c) {
				rep.Runs = append(rep.Runs, b.attempts(ctx, srv, c, 0, 0))
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	rep.Minutes = math.Round(time.Since(began).Minutes()*10) / 10
	if err := write(o.out, &rep); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if r.Outcome == "WRONG VALUES" {
			return fmt.Errorf("%s under %s at %d%%: WRONG VALUES (see %s)", r.Server, r.Config, r.Local, o.out)
		}
	}
	return nil
}

// attempts does a run, and once more if it did not finish; wrong values
// are never retried away.
func (b *bench) attempts(ctx context.Context, srv *server, config string, pct int, local uint64) Run {
	r := b.runOnce(ctx, srv, config, pct, local)
	logRun(r)
	if r.Outcome == "ok" || r.Outcome == "WRONG VALUES" || strings.HasPrefix(r.Outcome, "n/a") || ctx.Err() != nil {
		return r
	}
	first := r.Outcome
	r = b.runOnce(ctx, srv, config, pct, local)
	r.Retried = first
	logRun(r)
	return r
}

func logRun(r Run) {
	fmt.Fprintf(os.Stderr, "%-9s %-8s %3d%% %6.1f MiB  %s", r.Server, r.Config, r.Local, r.LocalMiB, r.Outcome)
	if r.Retried != "" {
		fmt.Fprintf(os.Stderr, " (retried after: %s)", r.Retried)
	}
	if r.RSSMiB > 0 {
		fmt.Fprintf(os.Stderr, "  load %.0f/s, RSS %.1f MiB", r.LoadPerSec, r.RSSMiB)
	}
	fmt.Fprintln(os.Stderr)
	for _, p := range r.Phases {
		fmt.Fprintf(os.Stderr, "    %-7s %9.0f/s  p50 %7.1f  p99 %8.1f  p99.9 %8.1f µs  misses/req %.3f  cpu server %.2f agent %.2f memd %.2f s\n",
			p.Dist, p.PerSecond, p.P50us, p.P99us, p.P999us, p.MissesPerOp, p.ServerCPU, p.AgentCPU, p.MemdCPU)
	}
}

func firstLine(path string) string {
	b, _ := os.ReadFile(path)
	l, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(l)
}

func mib(b uint64) float64 { return math.Round(float64(b)/(1<<20)*10) / 10 }
