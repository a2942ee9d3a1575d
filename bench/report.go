package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// servicesLink points from this report to the services' (make
// bench-services writes it; make bench writes both).
const servicesLink = "**Services**: Redis and memcached with their memory 2-4x their local share, requests per second and " +
	"tail latency under the kernel's swap and under rmem: [`services/README.md`](services/README.md) (`make bench-services`).\n\n"

// write saves the report: results.json, README.md and a plot per local
// share.
func write(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# rmem benchmarks against the kernel's own swap\n\n")
	fmt.Fprintf(&md, "Written by `make bench` (`bench/`) on %s: %s, %d CPUs, Linux %s, %s. Each workload "+
		"(`bench/workload/workload.c`) works on a %d MiB heap; the seconds are its measured phase, run once each, "+
		"in one session. **zram**: the kernel's swap to a zram device, the program in a memory cgroup "+
		"limited to the local share. **rmem-swap**: `memagent run --mode swap` (the kernel swaps to a pool "+
		"file). **rmem-tcp**, **rmem-shm**: `memagent run`'s userfaultfd pager, pages over tcp or shared "+
		"memory to a memd on this host; **-it**: with `--in-thread`, the faults taken in the faulting thread "+
		"(a SIGBUS handler and the fault ring) instead of in the kernel. Every run's checksum equals the all-local one, or it says so.\n\n",
		rep.Date, rep.Host, rep.CPUs, rep.Kernel, rep.CPUIdle, rep.HeapMiB)
	md.WriteString(servicesLink)
	if t := rep.Touch; t.Outcome == "ok" && t.SlowAccesses > 0 {
		fmt.Fprintf(&md, "**The floor**: a page fault with nothing paged, the first write to each page of a fresh "+
			"%d MiB heap all local (the kernel zero-fills it; workload `touch`), takes p50 %.1f µs, p99 %.1f µs on this "+
			"machine (%d faults). rand and zipf time each read as the program sees it, fault included (one clock read per "+
			"read: it serializes them, so their all-local time is the clock's); their **slow reads** tables count the reads "+
			"over 2 µs, their page faults, for the kernel's swap and rmem alike. The agent's fault p50 (from a fault's read "+
			"to its page installed) leaves out the trap and the resume; its **install p50** is that fault's last step for "+
			"a page read from the pool, the UFFDIO_COPY that maps it and wakes the thread waiting for it. **agent CPU** is "+
			"the agent's own (not the program's), **of it polling** what its threads spent polling for their next fault or "+
			"reply instead of sleeping (`--spin`), and **memd CPU** the memory server's during the run (over shm the agent "+
			"reads and writes the pool's memory itself).\n\n",
			rep.HeapMiB, t.AccessP50us, t.AccessP99us, t.SlowAccesses)
	}
	for _, pct := range []int{50, 25} {
		fmt.Fprintf(&md, "## %d%% local (%d MiB)\n\n", pct, rep.HeapMiB*pct/100)
		fmt.Fprintf(&md, "![time over all-local, %d%% local](ratio-%d.svg)\n\n", pct, pct)
		md.WriteString("| workload | local s | zram s | rmem-swap s |")
		for _, c := range uffdConfigs {
			fmt.Fprintf(&md, " %s s |", c)
		}
		for _, c := range uffdConfigs {
			fmt.Fprintf(&md, " %s / zram |", strings.TrimPrefix(c, "rmem-"))
		}
		fmt.Fprintf(&md, "\n|---|---|---|---|%s\n", strings.Repeat("---|", 2*len(uffdConfigs)))
		for _, w := range rep.Workloads {
			loc, z := rep.find(w, "local", 100), rep.find(w, "zram", pct)
			fmt.Fprintf(&md, "| %s | %s | %s | %s |", w, cell(loc), cell(z), cell(rep.find(w, "rmem-swap", pct)))
			for _, c := range uffdConfigs {
				fmt.Fprintf(&md, " %s |", cell(rep.find(w, c, pct)))
			}
			for _, c := range uffdConfigs {
				fmt.Fprintf(&md, " %s |", ratio(rep.find(w, c, pct), z))
			}
			md.WriteString("\n")
		}
		fmt.Fprintf(&md, "\n| workload | config | faults | in-thread | fault p50 µs | fault p99 µs | install p50 µs | thread wait p50 µs | agent CPU s | of it polling s | memd CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, w := range rep.Workloads {
			for _, c := range uffdConfigs {
				if r := rep.find(w, c, pct); r != nil && r.Outcome == "ok" {
					fmt.Fprintf(&md, "| %s | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", w, strings.TrimPrefix(c, "rmem-"), r.Faults,
						r.RingFaults, r.P50us, r.P99us, r.InstallP50us, r.RingP50us, r.AgentCPU, r.AgentPoll, r.MemdCPU)
				}
			}
		}
		rep.slowReads(&md, pct)
		md.WriteString("\n")
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("ratio-%d.svg", pct)), []byte(rep.plot(pct)), 0o644); err != nil {
			return err
		}
	}
	var notes []string
	for _, r := range rep.Results {
		if r.Outcome != "ok" && r.Outcome != "oom-killed" {
			notes = append(notes, fmt.Sprintf("- %s, %s, %d%% local: %s", r.Workload, r.Config, r.Local, r.Outcome))
		}
	}
	if len(notes) > 0 {
		md.WriteString("Runs that did not finish:\n\n" + strings.Join(notes, "\n") + "\n\n")
	}
	md.WriteString("`results.json` has every figure. Rerun with `make bench` (root; about 7 minutes, then the services' report).\n")
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(md.String()), 0o644)
}

// slowReads writes, for the timed workloads, each configuration's reads
// over 2 µs as the program saw them: p50 / p99 µs (how many).
func (rep *Report) slowReads(md *strings.Builder, pct int) {
	cfgs := configs[1:]
	header := false
	for _, w := range rep.Workloads {
		if !rep.timed(w) {
			continue
		}
		if !header {
			fmt.Fprintf(md, "\n| slow reads: p50 / p99 µs (count) | %s |\n|---%s|\n", strings.Join(cfgs, " | "), strings.Repeat("|---", len(cfgs)))
			header = true
		}
		fmt.Fprintf(md, "| %s |", w)
		for _, c := range cfgs {
			r := rep.find(w, c, pct)
			if r == nil || r.Outcome != "ok" {
				fmt.Fprintf(md, " %s |", cell(r))
				continue
			}
			fmt.Fprintf(md, " %.1f / %.1f (%d) |", r.AccessP50us, r.AccessP99us, r.SlowAccesses)
		}
		md.WriteString("\n")
	}
}

// timed reports whether workload w timed its accesses: a run of it
// counted slow ones (the untimed workloads print no count).
func (rep *Report) timed(w string) bool {
	for _, r := range rep.Results {
		if r.Workload == w && r.SlowAccesses > 0 {
			return true
		}
	}
	return false
}

func (rep *Report) find(w, c string, pct int) *Result {
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Workload == w && r.Config == c && r.Local == pct {
			return r
		}
	}
	return nil
}

func cell(r *Result) string {
	switch {
	case r == nil:
		return "-"
	case r.Outcome == "ok":
		return fmt.Sprintf("%.3f", r.Seconds)
	case r.Outcome == "oom-killed":
		return "**OOM-killed**"
	case strings.HasPrefix(r.Outcome, "n/a"):
		return "n/a"
	}
	return "**failed**" // results.json says how
}

func ratio(a, b *Result) string {
	if a == nil || b == nil || a.Outcome != "ok" || b.Outcome != "ok" || b.Seconds <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a.Seconds/b.Seconds)
}

// plot draws, for each workload, each configuration's time over the
// all-local time, on a log scale, as an SVG bar chart.
func (rep *Report) plot(pct int) string {
	cfgs := configs[1:]
	colors := map[string]string{"zram": "#888888", "rmem-swap": "#d9a03f", "rmem-tcp": "#3f7fd9", "rmem-shm": "#3fb96a",
		"rmem-tcp-it": "#1f3f8f", "rmem-shm-it": "#1f7f3a"}
	const w, h, left, top, bottom, barW = 900, 360, 60, 40, 60, 18
	maxR := 2.0
	for _, wl := range rep.Workloads {
		loc := rep.find(wl, "local", 100)
		for _, c := range cfgs {
			if r := rep.find(wl, c, pct); r != nil && r.Outcome == "ok" && loc != nil && loc.Seconds > 0 {
				maxR = max(maxR, r.Seconds/loc.Seconds)
			}
		}
	}
	logMax := math.Ceil(math.Log10(maxR))
	y := func(r float64) float64 { // r ≥ 1 on a log axis from 1 to 10^logMax
		return top + (h-top-bottom)*(1-math.Log10(max(r, 1))/logMax)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">Time over all-local at %d%% local (log scale; lower is better)</text>`+"\n", left, pct)
	for e := 0.0; e <= logMax; e++ {
		yy := y(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g×</text>`+"\n",
			left, w-10, yy, yy, left-6, yy+4, math.Pow(10, e))
	}
	group := float64(w-left-10) / float64(len(rep.Workloads))
	for i, wl := range rep.Workloads {
		x0 := float64(left) + group*float64(i) + (group-float64(len(cfgs)*barW))/2
		loc := rep.find(wl, "local", 100)
		for j, c := range cfgs {
			r := rep.find(wl, c, pct)
			x := x0 + float64(j*barW)
			switch {
			case r != nil && r.Outcome == "oom-killed":
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" transform="rotate(-90 %.1f %.1f)">OOM</text>`+"\n", x+15, float64(h-bottom)-4, x+15, float64(h-bottom)-4)
			case r != nil && r.Outcome == "ok" && loc != nil && loc.Seconds > 0:
				ratio := r.Seconds / loc.Seconds
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s"><title>%s %s: %.2f×</title></rect>`+"\n",
					x, y(ratio), barW-2, float64(h-bottom)-y(ratio), colors[c], wl, c, ratio)
			}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+group*(float64(i)+0.5), h-bottom+16, wl)
	}
	for j, c := range cfgs {
		x := left + j*130
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, h-22, colors[c], x+16, h-12, c)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
