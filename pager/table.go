package pager

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteTable prints stats as the human table of `memagent stats`: one row
// per client process.
func WriteTable(w io.Writer, stats []ClientStats) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PID\tRESIDENT\tREMOTE\tBUDGET\tFAULTS\tP50\tP99\tEVICTIONS\tWRITE-BACKS\tPREFETCH HITS\tLOST\t")
	for _, s := range stats {
		hit := "-"
		if s.PrefetchHits+s.PrefetchWasted > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*s.PrefetchHitRate())
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%d\t\n",
			s.PID, bytesText(s.ResidentBytes), bytesText(s.RemoteBytes), bytesText(s.BudgetBytes),
			s.Faults, durText(s.FaultP50), durText(s.FaultP99), s.Evictions, s.WriteBacks, hit, s.Lost)
	}
	return tw.Flush()
}

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

func durText(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}
