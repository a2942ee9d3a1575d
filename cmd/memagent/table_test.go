package main

import (
	"rmem/pager"
	"strings"
	"testing"
	"time"
)

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	err := writeTable(&b, []pager.ClientStats{
		{PID: 42, ResidentBytes: 3 << 20, RemoteBytes: 5 << 30, BudgetBytes: 512 << 10, Faults: 7,
			FaultLatency: pager.FaultLatency{FaultP50: 16 * time.Microsecond, FaultP99: time.Millisecond, InstallP50: 12300 * time.Nanosecond}, PrefetchHits: 3, PrefetchWasted: 1},
		{PID: 43},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"PID", "42", "3.0MiB", "5.0GiB", "512KiB", "16µs", "1ms", "12.3µs", "75%", "43"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 3 {
		t.Errorf("%d lines:\n%s", n, out)
	}
}
