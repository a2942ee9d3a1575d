package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// rewrite writes the report of a results.json again (after a change of
// the report's form).
func rewrite(results, dir string) error {
	b, err := os.ReadFile(results)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", results, err)
	}
	return write(dir, &rep)
}

// write saves the report: results.json, README.md and a plot per server.
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
	rep.intro(&md)
	for _, s := range rep.servers() {
		base := rep.find(s, "local", 100)
		fmt.Fprintf(&md, "## %s\n\n", s)
		if base != nil && base.Outcome == "ok" {
			fmt.Fprintf(&md, "All local, after loading: **%.1f MiB resident** (VmRSS); 50%% local is %.1f MiB, 25%% is %.1f MiB. ",
				base.RSSMiB, base.RSSMiB/2, base.RSSMiB/4)
		}
		fmt.Fprintf(&md, "GET/s relative to zram's at the same local share, and to all-local's:\n\n![GET/s over zram's and over all-local's, %s](%s.svg)\n\n", s, s)
		if err := os.WriteFile(filepath.Join(dir, s+".svg"), []byte(rep.plot(s)), 0o644); err != nil {
			return err
		}
		rep.mainTable(&md, s)
		rep.autoNote(&md, s)
		rep.missRatios(&md, s)
		rep.detailTable(&md, s)
	}
	rep.notes(&md)
	fmt.Fprintf(&md, "`results.json` has every figure. Rerun with `make bench-services` (root; this run took %.1f minutes).\n", rep.Minutes)
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(md.String()), 0o644)
}

func (rep *Report) intro(md *strings.Builder) {
	fmt.Fprintf(md, "# Services against the kernel's own swap: Redis and memcached\n\n")
	fmt.Fprintf(md, "Written by `make bench-services` (`bench/services`, load generator `bench/loadgen`) on %s: %s, %d CPUs, "+
		"Linux %s, %s; load average before it started: %s. Servers: %s.\n\n",
		rep.Date, rep.Host, rep.CPUs, rep.Kernel, rep.CPUIdle, rep.Load, strings.Join(rep.Versions, "; "))
	fmt.Fprintf(md, "What a service's users judge is requests per second and tail latency. Each server runs on a private "+
		"Unix socket without persistence (`redis-server --save '' --appendonly no`, `memcached -m 2048`, its default 4 threads) "+
		"and is loaded with %d keys of %d-byte values (%.0f MiB of values) by %d connections; its resident memory after "+
		"loading all local is its footprint, and the local shares are 50%% and 25%% of it. Then %d uniform GETs warm it up "+
		"unmeasured, %d uniform GETs are measured, %d Zipfian GETs (theta %.2f, the popular keys scattered over the key space) "+
		"warm up the hot set unmeasured and %d Zipfian GETs are measured. Each connection has one request outstanding "+
		"(closed loop); latency is per request as the client sees it (log-linear histogram, under 1%% error). "+
		"**Every value read, warm-up included, is checked** against the one loaded (each key's value is derived from it).\n\n",
		rep.Keys, rep.ValueSize, float64(rep.Keys)*float64(rep.ValueSize)/(1<<20), rep.Conns, rep.Warmup, rep.Requests,
		rep.ZipfWarmup, rep.Theta, rep.Requests)
	fmt.Fprintf(md, "**zram**: the kernel's swap to a zram device (lz4), the server in a v1 memory cgroup limited to the local "+
		"share (all of its memory counts). **rmem-tcp**, **rmem-shm**: `memagent run --local-mem SHARE` under a `memagent serve "+
		"--network tcp|shm` of the run's own (so that its stats can be read during the run), pages to a memd on this host; "+
		"**-it**: `memagent run --in-thread`, the faults taken in the faulting thread (a SIGBUS handler and the fault ring) "+
		"instead of in the kernel; "+
		"the budget covers the heap the shim pages, not the server's code and stacks (a few MiB). **misses/req**: page faults "+
		"that brought a page back, per GET, in the measured phase: zram's are the cgroup's `pgmajfault`, rmem's the server's "+
		"faults in `memagent stats`%s. **server / agent / memd CPU**: CPU seconds each process took during the measured phase "+
		"(procfs); the load generator runs on the same 2 CPUs. A run that does not finish (an OOM kill, a timeout) is retried "+
		"once and shown as what it is, never as a rate.\n\n", rep.minorNote())
}

// minorNote says how many of zram's faults pgmajfault leaves out: the
// minor ones, such as a page taken back from the swap cache before it was
// freed.
func (rep *Report) minorNote() string {
	var major, all uint64
	for _, r := range rep.Runs {
		if r.Config == "zram" {
			for _, p := range r.Phases {
				major, all = major+p.Misses, all+p.AllFaults
			}
		}
	}
	if major == 0 || all < major {
		return ""
	}
	return fmt.Sprintf(" (all of zram's faults in these phases, minor ones included, the cgroup's `pgfault`: %.2f%% more than its `pgmajfault`)",
		100*float64(all-major)/float64(major))
}

// missRatios says, for server s, rmem's misses per GET over zram's at the
// same share and key distribution.
func (rep *Report) missRatios(md *strings.Builder, s string) {
	var parts []string
	for _, pct := range rep.pcts() {
		for _, d := range []string{"uniform", "zipf"} {
			z := rep.find(s, "zram", pct)
			if z == nil || z.phase(d) == nil || z.phase(d).MissesPerOp <= 0 {
				continue
			}
			var vs []string
			for _, c := range rmemConfigs {
				if r := rep.find(s, c, pct); r != nil && r.phase(d) != nil {
					vs = append(vs, fmt.Sprintf("%s %.2f×", strings.TrimPrefix(c, "rmem-"), r.phase(d).MissesPerOp/z.phase(d).MissesPerOp))
				}
			}
			if len(vs) > 0 {
				parts = append(parts, fmt.Sprintf("%s at %d%%: %s", d, pct, strings.Join(vs, ", ")))
			}
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(md, "rmem's misses per GET over zram's at the same share: %s.\n\n", strings.Join(parts, "; "))
	}
}

// mainTable: GET/s, p99 and misses per request for each configuration,
// both distributions side by side.
func (rep *Report) mainTable(md *strings.Builder, s string) {
	fmt.Fprintf(md, "| config | local | uniform GET/s | × zram | p99 µs | misses/req | zipf GET/s | × zram | p99 µs | misses/req |\n")
	fmt.Fprintf(md, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rep.rows(s) {
		r := row.run
		fmt.Fprintf(md, "| %s | %s |", r.Config, localCell(r))
		for _, d := range []string{"uniform", "zipf"} {
			p := r.phase(d)
			if p == nil {
				fmt.Fprintf(md, " %s | | | |", outcomeCell(r))
				continue
			}
			fmt.Fprintf(md, " %.0f | %s | %.0f | %.3f |", p.PerSecond, rep.vsZram(r, d), p.P99us, p.MissesPerOp)
		}
		md.WriteString("\n")
	}
	md.WriteString("\n")
}

// detailTable: every phase's quantiles and CPU.
func (rep *Report) detailTable(md *strings.Builder, s string) {
	fmt.Fprintf(md, "| config | local | keys | GET/s | p50 µs | p99 µs | p99.9 µs | max µs | misses/req | server CPU s | agent CPU s | memd CPU s |\n")
	fmt.Fprintf(md, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rep.rows(s) {
		r := row.run
		for _, p := range r.Phases {
			agent, memd := "", ""
			if strings.HasPrefix(r.Config, "rmem") {
				agent, memd = fmt.Sprintf("%.2f", p.AgentCPU), fmt.Sprintf("%.2f", p.MemdCPU)
			}
			fmt.Fprintf(md, "| %s | %s | %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.3f | %.2f | %s | %s |\n", r.Config, localCell(r), p.Dist,
				p.PerSecond, p.P50us, p.P99us, p.P999us, p.MaxUs, p.MissesPerOp, p.ServerCPU, agent, memd)
		}
	}
	md.WriteString("\n")
}

// notes: the correctness check and the runs that did not finish.
func (rep *Report) notes(md *strings.Builder) {
	var checked, bad uint64
	var wrong, other []string
	for _, r := range rep.Runs {
		for _, p := range append(r.phases(), r.warmup()...) {
			checked += p.Requests
			bad += p.Wrong + p.Missing
		}
		switch {
		case r.Outcome == "WRONG VALUES":
			wrong = append(wrong, fmt.Sprintf("- **%s, %s, %d%% local: %s**", r.Server, r.Config, r.Local, describeBad(&r)))
		case r.Outcome != "ok":
			other = append(other, fmt.Sprintf("- %s, %s, %d%% local: %s", r.Server, r.Config, r.Local, r.Outcome))
		}
		if r.Retried != "" {
			other = append(other, fmt.Sprintf("- %s, %s, %d%% local: retried after a first attempt that did not finish (%s)", r.Server, r.Config, r.Local, r.Retried))
		}
	}
	if len(wrong) > 0 {
		fmt.Fprintf(md, "## WRONG VALUES\n\n%d of the %d GETs checked returned a wrong or missing value:\n\n%s\n\n", bad, checked, strings.Join(wrong, "\n"))
	} else {
		fmt.Fprintf(md, "**Correctness**: all %d GETs (warm-ups included) returned the value loaded.\n\n", checked)
	}
	if len(other) > 0 {
		md.WriteString("Runs that did not finish, or did on a second attempt:\n\n" + strings.Join(other, "\n") + "\n\n")
	}
}

type row struct{ run *Run }

// rows returns server s's runs in the tables' order: local, then each
// share's configurations.
func (rep *Report) rows(s string) []row {
	var out []row
	if r := rep.find(s, "local", 100); r != nil {
		out = append(out, row{r})
	}
	for _, pct := range rep.pcts() {
		for _, c := range configs[1:] {
			if r := rep.find(s, c, pct); r != nil {
				out = append(out, row{r})
			}
		}
	}
	for _, c := range autoConfigs {
		if r := rep.find(s, c, 0); r != nil {
			out = append(out, row{r})
		}
	}
	return out
}

// autoNote says, for server s, what each -auto run moved out and how fast
// it served against all-local.
func (rep *Report) autoNote(md *strings.Builder, s string) {
	base := rep.find(s, "local", 100)
	for _, c := range autoConfigs {
		r := rep.find(s, c, 0)
		if r == nil || r.Outcome != "ok" || base == nil || base.RSSMiB <= 0 {
			continue
		}
		var vs []string
		for _, d := range []string{"uniform", "zipf"} {
			if p, b := r.phase(d), base.phase(d); p != nil && b != nil && b.PerSecond > 0 {
				vs = append(vs, fmt.Sprintf("%s GETs %.2f× all-local's", d, p.PerSecond/b.PerSecond))
			}
		}
		fmt.Fprintf(md, "**%s** (`memagent serve --max-slowdown %s`, no `--local-mem`; its Zipfian warm-up went on for at least %.0f s, "+
			"for the budget to settle): at the end of its Zipfian phase "+
			"%.1f MiB of the server's pages were in the pool (%.0f%% of its all-local footprint), its budget %.1f MiB, "+
			"the stall last seen %.1f%%, VmRSS %.1f MiB; %s.\n\n",
			c, rep.MaxSlowdown, rep.SettleSecs, r.RemoteMiB, 100*r.RemoteMiB/base.RSSMiB, r.BudgetMiB, r.StallPct, r.EndRSSMiB, strings.Join(vs, ", "))
	}
}

func (rep *Report) servers() []string {
	var out []string
	for _, r := range rep.Runs {
		if len(out) == 0 || out[len(out)-1] != r.Server {
			out = append(out, r.Server)
		}
	}
	return out
}

func (rep *Report) pcts() []int {
	var out []int
	seen := map[int]bool{100: true, 0: true} // 0: the -auto runs, which have no share
	for _, r := range rep.Runs {
		if !seen[r.Local] {
			seen[r.Local] = true
			out = append(out, r.Local)
		}
	}
	return out
}

func (rep *Report) find(s, c string, pct int) *Run {
	for i := range rep.Runs {
		if r := &rep.Runs[i]; r.Server == s && r.Config == c && r.Local == pct {
			return r
		}
	}
	return nil
}

func (r *Run) phase(d string) *Phase {
	if r.Outcome != "ok" {
		return nil
	}
	for i := range r.Phases {
		if r.Phases[i].Dist == d {
			return &r.Phases[i]
		}
	}
	return nil
}

func (r *Run) phases() []Phase { return r.Phases }

func (r *Run) warmup() []Phase {
	if r.Warmup == nil {
		return nil
	}
	return []Phase{*r.Warmup}
}

// vsZram is r's GET/s over zram's at the same share.
func (rep *Report) vsZram(r *Run, d string) string {
	if r.Config == "zram" || r.Config == "local" {
		return ""
	}
	z := rep.find(r.Server, "zram", r.Local)
	if z == nil || z.phase(d) == nil || z.phase(d).PerSecond <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", r.phase(d).PerSecond/z.phase(d).PerSecond)
}

func localCell(r *Run) string {
	switch {
	case r.Config == "local":
		return "all"
	case strings.HasSuffix(r.Config, "-auto"):
		return fmt.Sprintf("auto (%.0f MiB)", r.BudgetMiB)
	}
	return fmt.Sprintf("%d%% (%.0f MiB)", r.Local, r.LocalMiB)
}

func outcomeCell(r *Run) string {
	switch {
	case r.Outcome == "oom-killed":
		return "**OOM-killed**"
	case r.Outcome == "WRONG VALUES":
		return "**WRONG VALUES**"
	case strings.HasPrefix(r.Outcome, "timed out"):
		return "**timed out**"
	case strings.HasPrefix(r.Outcome, "n/a"):
		return "n/a"
	}
	return "**failed**" // results.json says how
}

// plot draws, for server s, two panels of SVG bar charts on log scales:
// each configuration's GET/s over zram's at the same local share and key
// distribution, and over all-local's.
func (rep *Report) plot(s string) string {
	const w, panelH = 760, 330
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, 2*panelH)
	rep.panel(&b, s, "zram", append([]string{"local"}, rmemConfigs...), 0, w, panelH)
	rep.panel(&b, s, "local", append([]string{"zram"}, rmemConfigs...), panelH, w, panelH)
	b.WriteString("</svg>\n")
	return b.String()
}

var colors = map[string]string{"local": "#888888", "zram": "#d9a03f", "rmem-tcp": "#3f7fd9", "rmem-shm": "#3fb96a",
	"rmem-tcp-it": "#1f3f8f", "rmem-shm-it": "#1f7f3a"}

// rmemConfigs are the configurations under rmem: over tcp and shm, the
// faults taken in the kernel or (-it) in the faulting thread.
var rmemConfigs = []string{"rmem-tcp", "rmem-shm", "rmem-tcp-it", "rmem-shm-it"}

// panel draws cfgs' GET/s over base's (zram at the same share, or all
// local) for each key distribution and share, in a panel at y offset top0.
func (rep *Report) panel(b *strings.Builder, s, base string, cfgs []string, top0, w, h int) {
	type group struct {
		label string
		pct   int
		dist  string
	}
	var groups []group
	for _, d := range []string{"uniform", "zipf"} {
		for _, pct := range rep.pcts() {
			groups = append(groups, group{fmt.Sprintf("%s, %d%% local", d, pct), pct, d})
		}
	}
	get := func(c string, g group) *Phase {
		r := rep.find(s, c, g.pct)
		if c == "local" {
			r = rep.find(s, "local", 100)
		}
		if r == nil {
			return nil
		}
		return r.phase(g.dist)
	}
	ratio := func(c string, g group) (float64, bool) {
		r, z := get(c, g), get(base, g)
		if r == nil || z == nil || z.PerSecond <= 0 || r.PerSecond <= 0 {
			return 0, false
		}
		return r.PerSecond / z.PerSecond, true
	}
	lo, hi := 1.0, 1.0
	for _, g := range groups {
		for _, c := range cfgs {
			if v, ok := ratio(c, g); ok {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	eLo, eHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if eHi == eLo {
		eHi++
	}
	const left, top, bottom, barW = 60, 40, 60, 26
	y := func(v float64) float64 {
		return float64(top0+top) + float64(h-top-bottom)*(eHi-math.Log10(v))/(eHi-eLo)
	}
	what := "zram's at the same local share"
	if base == "local" {
		what = "all-local's"
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14">%s: GET/s over %s (log scale; higher is better)</text>`+"\n", left, top0+20, s, what)
	for e := eLo; e <= eHi; e++ {
		for _, m := range []float64{1, 2, 5} {
			if e == eHi && m > 1 {
				break
			}
			v := m * math.Pow(10, e)
			stroke := "#eee"
			if v == 1 {
				stroke = "#444"
			}
			fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/><text x="%d" y="%.1f" text-anchor="end">%g×</text>`+"\n",
				left, w-10, y(v), y(v), stroke, left-6, y(v)+4, v)
		}
	}
	gw := float64(w-left-10) / float64(len(groups))
	for i, g := range groups {
		mid := float64(left) + gw*(float64(i)+0.5)
		x0 := mid - float64(len(cfgs)*barW)/2
		if get(base, g) == nil {
			if r := rep.find(s, base, g.pct); r != nil && base != "local" {
				fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="11">%s: %s</text>`+"\n", mid, top0+top+14, base, strings.Trim(outcomeCell(r), "*"))
			}
		}
		for j, c := range cfgs {
			x := x0 + float64(j*barW)
			v, ok := ratio(c, g)
			if !ok {
				if r := rep.find(s, c, g.pct); r != nil && get(base, g) != nil {
					yy := float64(top0 + h - bottom - 4)
					fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="10" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
						x+15, yy, x+15, yy, strings.Trim(outcomeCell(r), "*"))
				}
				continue
			}
			y0, y1 := min(y(1), y(v)), max(y(1), y(v))
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%d" height="%.1f" fill="%s"><title>%s, %s: %.2f×</title></rect>`+"\n",
				x, y0, barW-2, max(y1-y0, 1), colors[c], g.label, c, v)
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", mid, top0+h-bottom+16, g.label)
	}
	for j, c := range cfgs {
		x := left + j*150
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, top0+h-22, colors[c], x+16, top0+h-12, c)
	}
}
