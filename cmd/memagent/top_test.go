package main

import (
	"strings"
	"testing"
	"time"

	"rmem/internal/agentd"
	"rmem/internal/livetop"
	"rmem/pager"
)

func TestTopFrame(t *testing.T) {
	prev := agentd.StatsResponse{Clients: []pager.ClientStats{
		{ID: 1, PID: 4242, Faults: 1000, Evictions: 500, WriteBacks: 100, Stall: 100 * time.Millisecond},
		{ID: 2, PID: 77, Faults: 10},
	}, Process: agentd.ProcessCPU{CPU: time.Second}}
	cur := agentd.StatsResponse{Clients: []pager.ClientStats{
		{ID: 1, PID: 4242, Faults: 21000, Evictions: 10500, WriteBacks: 2100, Stall: 600 * time.Millisecond,
			ResidentBytes: 64 << 20, RemoteBytes: 200 << 20, BudgetBytes: 64 << 20,
			FaultLatency: pager.FaultLatency{FaultP50: 8700 * time.Nanosecond, FaultP99: 1200 * time.Microsecond},
			Trouble:      pager.Trouble{BudgetWaits: 12345}, PrefetchCounts: pager.PrefetchCounts{PrefetchHits: 3, PrefetchWasted: 1}},
		{ID: 2, PID: 77, Faults: 12, ResidentBytes: 1 << 30},
		{ID: 3, PID: 9000000, Faults: 5}, // new: no rates yet
	}, Pool: pager.PoolStats{HeldBytes: 256 << 20, Slabs: 4, UsedBytes: 200 << 20, NoRoom: "pool full"}, Replicas: 2,
		Process: agentd.ProcessCPU{CPU: 1500 * time.Millisecond}}
	dt := 2 * time.Second
	rows := topRows(prev, cur, dt)
	if r := rows[0]; !r.rated || r.misses != 10000 || r.evicts != 5000 || r.wbs != 1000 || r.stall != 0.25 {
		t.Fatalf("rates of pid 4242: %+v", r)
	}
	if rows[2].rated {
		t.Fatal("a program new since the last frame has rates")
	}
	sortTop(rows, 'm')
	if rows[0].s.PID != 4242 || rows[1].s.PID != 77 {
		t.Fatalf("by misses/s: %d %d %d", rows[0].s.PID, rows[1].s.PID, rows[2].s.PID)
	}
	sortTop(rows, 'r')
	if rows[0].s.PID != 77 {
		t.Fatalf("by resident: %d first", rows[0].s.PID)
	}
	sortTop(rows, 'p')
	if rows[0].s.PID != 77 || rows[2].s.PID != 9000000 {
		t.Fatal("by pid")
	}
	sortTop(rows, 'm')
	var b strings.Builder
	now := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
	comm := func(pid int) string { return "redis-server" }
	if err := livetop.Fit(&b, topLines(prev, cur, rows, dt, now, 'm', false, comm), 80, 24, "\n"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if n := len([]rune(l)); n > 80 {
			t.Errorf("a line of %d columns at 80: %q", n, l)
		}
	}
	for _, want := range []string{"programs 3", "agent CPU 25% (polling 0%)", "256M held in 4 slabs", "rep:2", "NO ROOM: pool full",
		"   4242 64.0M  200M 64.0M  10.0k 8.7µs 1.2ms 25.0%   5.0k   1.0k  75%  12k    0",
		"     77  1.0G    0B    0B      1     -     -  0.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q", want)
		}
	}
	if strings.Contains(out, "COMMAND") {
		t.Error("COMMAND at 80 columns: there is no room")
	}
	b.Reset()
	livetop.Fit(&b, topLines(prev, cur, rows, dt, now, 'm', true, comm), 120, 6, "\n")
	if out := b.String(); !strings.Contains(out, "COMMAND") || !strings.Contains(out, "redis-server") || strings.Count(out, "\n") != 6 {
		t.Errorf("at 120x6: want COMMAND and 6 lines:\n%s", out)
	}
}
