package main

import (
	"strings"
	"testing"
	"time"

	"rmem/internal/agentd"
	"rmem/pager"
	"rmem/spin"
)

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	err := writeTable(&b, []pager.ClientStats{
		{PID: 42, ResidentBytes: 3 << 20, RemoteBytes: 5 << 30, BudgetBytes: 512 << 10, Faults: 7,
			FaultLatency: pager.FaultLatency{FaultP50: 16 * time.Microsecond, FaultP99: time.Millisecond, InstallP50: 12300 * time.Nanosecond}, PrefetchCounts: pager.PrefetchCounts{PrefetchHits: 3, PrefetchWasted: 1}},
		{PID: 43, Auto: true, StallPct: 1.5},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"PID", "42", "3.0MiB", "5.0GiB", "512KiB", "16µs", "1ms", "12.3µs", "75%", "43", "STALL", "1.50%"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 3 {
		t.Errorf("%d lines:\n%s", n, out)
	}
}

func TestWriteProcess(t *testing.T) {
	var b strings.Builder
	err := writeProcess(&b, agentd.ProcessCPU{CPU: 21320 * time.Millisecond, Spin: []spin.SiteStats{
		{Name: "agent-loop", Spun: 5994 * time.Millisecond, Hits: 149106, Misses: 34890},
		{Name: "tcp-client", Spun: 3759 * time.Millisecond, Hits: 192154, Misses: 7544},
		{Name: "tcp-server"}, // never waited here: left out
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := "agent process: 21.32s of CPU, 9.75s of it polling (agent-loop 5.99s: 149106 waits caught, 34890 polls ran out; tcp-client 3.76s: 192154 waits caught, 7544 polls ran out)\n"
	if b.String() != want {
		t.Errorf("got  %q\nwant %q", b.String(), want)
	}
	b.Reset()
	if err := writeProcess(&b, agentd.ProcessCPU{CPU: 30 * time.Millisecond, Spin: []spin.SiteStats{{Name: "agent-loop"}}}); err != nil {
		t.Fatal(err)
	}
	if want := "agent process: 0.03s of CPU, none of it polling\n"; b.String() != want {
		t.Errorf("got  %q\nwant %q", b.String(), want)
	}
}
