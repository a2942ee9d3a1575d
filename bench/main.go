// Command bench is make bench: it runs rmem's paging benchmarks side by
// side with the kernel's own swap in one session, and writes the report
// (docs/bench: README.md, results.json and SVG plots).
//
// Each workload of bench/workload/workload.c (sequential, uniform random, Zipfian,
// qsort, k-means over a 128 MiB heap) runs all local, under the kernel's
// swap to zram in a memory cgroup limited to the local share (an OOM kill
// is recorded as a result), under memagent run --mode swap, and under
// memagent run's userfaultfd pager over tcp and over shm, at 50% and 25%
// local. Every run's checksum must equal the all-local one. rand and zipf
// time each read as the program sees it, so that the report compares the
// kernel's page faults with rmem's the same way, and a first-touch run
// (workload touch) gives the floor: what a page fault costs on this
// machine when nothing is paged. The machine is measured as it is (the
// cpuidle policy is reported, never changed).
//
// It needs root, gcc, zram and the binaries of make build. It is not a
// test: CI does not run it.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"rmem/bench/harness"
	"rmem/internal/cgroup"
	"rmem/internal/cpuidle"
)

// Result is one run.
type Result struct {
	Workload string  `json:"workload"`
	Config   string  `json:"config"`
	Local    int     `json:"local_percent"`
	Seconds  float64 `json:"seconds"`  // the measured phase
	Checksum string  `json:"checksum"` // equal to the all-local run's
	// Outcome is "ok", "oom-killed", "wrong checksum", "failed: ..." or
	// "n/a: ..." (the configuration cannot run here).
	Outcome string  `json:"outcome"`
	Faults  uint64  `json:"faults,omitempty"`
	P50us   float64 `json:"fault_p50_us,omitempty"`
	P99us   float64 `json:"fault_p99_us,omitempty"`
	// InstallP50us: of P50us, the UFFDIO_COPY that maps a page read from
	// the pool and wakes its thread (memagent stats' INSTALL).
	InstallP50us float64 `json:"install_p50_us,omitempty"`
	// RingFaults are the faults taken in the faulting thread (--in-thread,
	// memagent stats' IN-THREAD), and RingP50us their threads' wait p50.
	RingFaults uint64  `json:"in_thread_faults,omitempty"`
	RingP50us  float64 `json:"in_thread_wait_p50_us,omitempty"`
	AgentCPU   float64 `json:"agent_cpu_seconds,omitempty"` // memagent's CPU time (its own, not the program's)
	// AgentPoll: of AgentCPU, what its threads spent polling for their
	// next event instead of sleeping (memagent --spin).
	AgentPoll float64 `json:"agent_poll_seconds,omitempty"`
	// MemdCPU is the memory server's CPU time during the run: over tcp it
	// serves every page read and write; over shm the agent reads and
	// writes its memory itself.
	MemdCPU float64 `json:"memd_cpu_seconds,omitempty"`
	// Timed accesses (rand, zipf, touch), as the program sees them: those
	// over 2 µs (its page faults) and their quantiles. Unlike P50us (the
	// agent's, from a fault's read to its page installed), these include
	// the fault's trap and the thread's resume, and measure zram's faults
	// the same way.
	SlowAccesses uint64  `json:"slow_accesses,omitempty"`
	AccessP50us  float64 `json:"slow_access_p50_us,omitempty"`
	AccessP99us  float64 `json:"slow_access_p99_us,omitempty"`
}

// Report is what make bench writes.
type Report struct {
	Date      string   `json:"date"`
	Host      string   `json:"host"`
	CPUs      int      `json:"cpus"`
	Kernel    string   `json:"kernel"`
	CPUIdle   string   `json:"cpuidle"`
	HeapMiB   int      `json:"heap_mib"`
	Workloads []string `json:"workloads"`
	Results   []Result `json:"results"`
	// Touch is the floor: the first write to each page of a fresh heap,
	// all local (workload touch): what a page fault costs on this machine
	// when nothing is paged.
	Touch Result `json:"first_touch"`
}

var configs = []string{"local", "zram", "rmem-swap", "rmem-tcp", "rmem-shm", "rmem-tcp-it", "rmem-shm-it"}

// uffdConfigs are the configurations of memagent run's userfaultfd pager:
// over tcp and shm, with faults taken in the kernel or (-it) in the
// faulting thread (--in-thread).
var uffdConfigs = []string{"rmem-tcp", "rmem-shm", "rmem-tcp-it", "rmem-shm-it"}

func main() {
	out := flag.String("out", "docs/bench", "report directory")
	bin := flag.String("bin", "bin", "directory of memd, memagent and librmem.so")
	heap := flag.Int("heap", 128, "heap of each workload, MiB")
	only := flag.String("workloads", "seq,rand,zipf,qsort,kmeans", "workloads to run, comma-separated")
	flag.Parse()
	if err := run(*out, *bin, *heap, strings.Split(*only, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(out, bin string, heap int, workloads []string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (memory cgroups, zram, userfaultfd for all)")
	}
	bin, _ = filepath.Abs(bin)
	tmp, err := os.MkdirTemp("", "rmem-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	wl := filepath.Join(tmp, "workload")
	if b, err := exec.Command("gcc", "-O2", "-o", wl, "bench/workload/workload.c", "-lm").CombinedOutput(); err != nil {
		return fmt.Errorf("gcc: %v: %s", err, b)
	}
	zramOff, zerr := harness.ZramOn()
	if zramOff != nil {
		defer zramOff()
	}
	md, err := harness.StartMemd(bin, tmp, 7490)
	if err != nil {
		return err
	}
	defer md.Stop()
	rep := Report{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), HeapMiB: heap, Workloads: workloads}
	rep.Host, _ = os.Hostname()
	if u, err := exec.Command("uname", "-r").Output(); err == nil {
		rep.Kernel = strings.TrimSpace(string(u))
	}
	if p, err := cpuidle.Read("/sys"); err == nil {
		rep.CPUIdle = p.String()
	}
	rep.Touch = runLocal(wl, "touch", heap)
	log(rep.Touch)
	for _, w := range workloads {
		base := runLocal(wl, w, heap)
		log(base)
		rep.Results = append(rep.Results, base)
		for _, pct := range []int{50, 25} {
			local := heap * pct / 100
			for _, c := range configs[1:] {
				var r Result
				switch {
				case c == "zram" && zerr != nil:
					r = Result{Outcome: "n/a: " + zerr.Error()}
				case c == "zram":
					r = runZram(wl, w, heap, local)
				default:
					r = runAgent(bin, md, wl, w, heap, local, strings.TrimPrefix(c, "rmem-"))
				}
				r.Workload, r.Config, r.Local = w, c, pct
				if r.Outcome == "ok" && r.Checksum != base.Checksum {
					r.Outcome = "wrong checksum"
				}
				log(r)
				rep.Results = append(rep.Results, r)
			}
		}
	}
	return write(out, &rep)
}

func log(r Result) {
	fmt.Fprintf(os.Stderr, "%-7s %-10s %3d%%  %8.3f s  %s\n", r.Workload, r.Config, r.Local, r.Seconds, r.Outcome)
}

// workloadLine is what the workload prints: seconds, checksum, CPU
// seconds, and for the timed ones the accesses over 2 µs and their p50
// and p99 in µs.
type workloadLine struct {
	secs, cpu float64
	sum       string
	slow      uint64
	p50, p99  float64
}

func parseWorkload(out string) (l workloadLine, err error) {
	f := strings.Fields(lastLine(out))
	if len(f) != 3 && len(f) != 6 {
		return l, fmt.Errorf("workload said %q", lastLine(out))
	}
	l.sum = f[1]
	errs := []error{parseFloat(f[0], &l.secs), parseFloat(f[2], &l.cpu)}
	if len(f) == 6 {
		var err error
		l.slow, err = strconv.ParseUint(f[3], 10, 64)
		errs = append(errs, err, parseFloat(f[4], &l.p50), parseFloat(f[5], &l.p99))
	}
	if err := errors.Join(errs...); err != nil {
		return l, fmt.Errorf("workload said %q: %w", lastLine(out), err)
	}
	return l, nil
}

func parseFloat(s string, v *float64) (err error) {
	*v, err = strconv.ParseFloat(s, 64)
	return err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func runLocal(wl, w string, heap int) Result {
	r := Result{Workload: w, Config: "local", Local: 100}
	out, err := exec.Command(wl, w, strconv.Itoa(heap)).Output()
	r.finish(string(out), err)
	return r
}

func (r *Result) finish(out string, err error) (cpu float64) {
	if err != nil {
		r.Outcome = "failed: " + err.Error()
		return 0
	}
	l, perr := parseWorkload(out)
	if perr != nil {
		r.Outcome = "failed: " + perr.Error()
		return 0
	}
	r.Seconds, r.Checksum, r.Outcome = l.secs, l.sum, "ok"
	r.SlowAccesses, r.AccessP50us, r.AccessP99us = l.slow, l.p50, l.p99
	return l.cpu
}

var zramRuns int

func runZram(wl, w string, heap, localMiB int) Result {
	var r Result
	// A cgroup of its own per run: one removed while the kernel still
	// holds swap charged to it lingers offline under its name.
	zramRuns++
	g, err := cgroup.Create(fmt.Sprintf("rmem-bench-%d-%d", os.Getpid(), zramRuns), uint64(localMiB)<<20)
	if err != nil {
		r.Outcome = "n/a: " + err.Error()
		return r
	}
	defer g.Remove(10 * time.Second)
	if g.Version == cgroup.V1 {
		os.WriteFile(filepath.Join(g.Path, "memory.swappiness"), []byte("100"), 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := g.Command(wl, w, strconv.Itoa(heap))
	out, err := harness.OutputCtx(ctx, cmd)
	if kills, _ := g.OOMKills(); kills > 0 {
		r.Outcome = "oom-killed"
		return r
	}
	r.finish(out, err)
	return r
}

// runAgent runs the workload under memagent run: mode swap (net "swap"),
// or the userfaultfd pager over net ("tcp", "shm"; with "-it", its faults
// taken in the faulting thread).
func runAgent(bin string, md *harness.Memd, wl, w string, heap, localMiB int, net string) Result {
	var r Result
	sock := filepath.Join(md.Dir, "agent-"+net+".sock")
	net, inThread := strings.CutSuffix(net, "-it")
	args := []string{"run", "--coordinator", md.URL, "--token-file", md.TokenFile, "--local-mem", fmt.Sprintf("%dMiB", localMiB),
		"--socket", sock, "--admin-socket", sock + ".admin", "--log-format", "json"}
	if net == "swap" {
		args = append(args, "--mode", "swap", "--swap-dir", filepath.Join(md.Dir, "swap"))
	} else {
		args = append(args, "--network", net, "--stats")
		if inThread {
			args = append(args, "--in-thread")
		}
	}
	args = append(args, "--", wl, w, strconv.Itoa(heap))
	cmd := exec.Command(filepath.Join(bin, "memagent"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	memd0, merr := md.CPU()
	out, err := harness.OutputCtx(ctx, cmd)
	memd1, merr1 := md.CPU()
	if err != nil {
		err = fmt.Errorf("%v: %s", err, lastLine(stderr.String()))
	}
	cpu := r.finish(out, err)
	if r.Outcome != "ok" {
		return r
	}
	if merr == nil && merr1 == nil {
		r.MemdCPU = math.Round((memd1-memd0)*100) / 100 // clock ticks of 10 ms
	}
	readStats(stderr.String(), &r)
	if r.AgentCPU == 0 && cmd.ProcessState != nil {
		// No --stats (mode swap): memagent's rusage, which includes the
		// program it waited for, less the program's.
		ps := cmd.ProcessState
		r.AgentCPU = max(0, (ps.UserTime()+ps.SystemTime()).Seconds()-cpu)
	}
	return r
}

// agentLine is the line memagent run --stats prints of its own agent's
// CPU time and the part of it spent polling (cmd/memagent/table.go).
var agentLine = regexp.MustCompile(`(?m)^agent process: ([0-9.]+)s of CPU, (?:([0-9.]+)s of it polling|none of it polling)`)

// readStats takes faults and the fault latency quantiles from the table
// memagent run --stats prints (by its header), and the agent's CPU time
// and polling from the line after it (the agent's own figures).
func readStats(s string, r *Result) {
	if m := agentLine.FindStringSubmatch(s); m != nil {
		parseFloat(m[1], &r.AgentCPU)
		if m[2] != "" {
			parseFloat(m[2], &r.AgentPoll)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	var header []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "PID" {
			header = f
			continue
		}
		if header == nil || len(f) == 0 {
			continue
		}
		for i, h := range header {
			if i >= len(f) {
				break
			}
			switch h {
			case "FAULTS":
				r.Faults, _ = strconv.ParseUint(f[i], 10, 64)
			case "P50":
				r.P50us = micros(f[i])
			case "P99":
				r.P99us = micros(f[i])
			case "IN-THREAD":
				if n, p50, ok := strings.Cut(f[i], "@"); ok {
					r.RingFaults, _ = strconv.ParseUint(n, 10, 64)
					r.RingP50us = micros(p50)
				}
			case "INSTALL":
				r.InstallP50us = micros(f[i])
			}
		}
		return
	}
}

func micros(s string) float64 {
	d, err := time.ParseDuration(strings.ReplaceAll(s, "µs", "us"))
	if err != nil {
		return 0
	}
	return float64(d) / float64(time.Microsecond)
}
