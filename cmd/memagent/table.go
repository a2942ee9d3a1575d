package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"rmem/internal/agentd"
	"rmem/pager"
)

// writeTable prints stats as the human table of `memagent stats`: one row
// per client process. FAULTS stays the sixth column (scripts read it). BAD: copies of its pages read from the pool that
// failed their checksum (repaired, or the page is LOST); LOST stays last.
func writeTable(w io.Writer, stats []pager.ClientStats) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PID\tRESIDENT\tREMOTE\tPOOLED\tBUDGET\tFAULTS\tP50\tP99\tP99.9\tSTALL\tCOLD\tINSTALL\tIN-THREAD\tEVICTIONS\tWRITE-BACKS\tPREFETCH HITS\tWAITS\tBAD\tLOST\t")
	for _, s := range stats {
		hit := "-"
		if s.PrefetchHits+s.PrefetchWasted > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*s.PrefetchHitRate())
		}
		inThread := "-"
		if s.RingFaults > 0 {
			inThread = fmt.Sprintf("%d@%s", s.RingFaults, durText(s.RingP50))
		}
		// STALL: the share of wall time in misses of a program whose
		// budget a slowdown target steers (BUDGET is then the
		// controller's); "-" for a fixed budget.
		stall := "-"
		if s.Auto {
			stall = fmt.Sprintf("%.2f%%", s.StallPct)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t\n",
			s.PID, bytesText(s.ResidentBytes), bytesText(s.RemoteBytes), bytesText(s.PooledBytes), bytesText(s.BudgetBytes),
			s.Faults, durText(s.FaultP50), durText(s.FaultP99), durText(s.FaultP999), stall, bytesText(s.ColdBytes), durText(s.InstallP50),
			inThread, s.Evictions, s.WriteBacks, hit, s.BudgetWaits, s.ChecksumErrors, s.Lost)
	}
	return tw.Flush()
}

// writePool prints the agent's pool space in one line: what it holds and
// what holds pages, and whether the pool has no room.
func writePool(w io.Writer, p pager.PoolStats) error {
	ratio := "-"
	if p.UsedBytes > 0 {
		ratio = fmt.Sprintf("%.2fx", float64(p.HeldBytes)/float64(p.UsedBytes))
	}
	_, err := fmt.Fprintf(w, "pool: %s held in %d slabs of %s, %s used by pages (held/used %s), %s stored (every copy and parity)",
		bytesText(p.HeldBytes), p.Slabs, bytesText(p.SlabSize), bytesText(p.UsedBytes), ratio, bytesText(p.StoredBytes))
	if err == nil && p.NoRoom != "" {
		_, err = fmt.Fprintf(w, "; NO ROOM since %s: %s", p.NoRoomSince.Format(time.TimeOnly), p.NoRoom)
	}
	if err == nil {
		_, err = fmt.Fprintln(w)
	}
	return err
}

// writeProcess prints the agent process's CPU time in one line, with the
// part its threads spent polling instead of sleeping, by kind of thread:
// how many waits a poll ended (a wake-up saved) and how many polls ran out
// and blocked after all.
func writeProcess(w io.Writer, p agentd.ProcessCPU) error {
	var sites []string
	for _, s := range p.Spin {
		if s.Hits+s.Misses == 0 {
			continue
		}
		sites = append(sites, fmt.Sprintf("%s %s: %d waits caught, %d polls ran out", s.Name, secText(s.Spun), s.Hits, s.Misses))
	}
	polled := "none of it polling"
	if len(sites) > 0 {
		polled = fmt.Sprintf("%s of it polling (%s)", secText(p.Polled()), strings.Join(sites, "; "))
	}
	_, err := fmt.Fprintf(w, "agent process: %s of CPU, %s\n", secText(p.CPU), polled)
	return err
}

// secText is d in seconds to 10 ms, the resolution of CPU times.
func secText(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func bytesText(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// durText is d to three significant digits or so (the histogram's
// precision is ~1%).
func durText(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d >= 100*time.Millisecond:
		d = d.Round(time.Millisecond)
	case d >= 100*time.Microsecond:
		d = d.Round(time.Microsecond)
	case d >= 10*time.Microsecond:
		d = d.Round(100 * time.Nanosecond)
	case d >= time.Microsecond:
		d = d.Round(10 * time.Nanosecond)
	}
	return d.String()
}
