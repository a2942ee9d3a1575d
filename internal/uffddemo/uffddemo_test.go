package uffddemo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"rmem/userfaultfd"
)

func TestMain(m *testing.M) {
	MaybeRunChild()
	goleak.VerifyTestMain(m)
}

func skipUnlessUFFD(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a userfaultfd for the child")
	}
	if _, _, err := userfaultfd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
}

func TestRun(t *testing.T) {
	skipUnlessUFFD(t)
	for _, batch := range []int{1, 16} {
		var out bytes.Buffer
		res, err := Run(context.Background(), &out, Options{Size: 8 << 20, Batch: batch})
		if err != nil {
			t.Fatalf("batch %d: %v\n%s", batch, err, &out)
		}
		pages := (8 << 20) / int(userfaultfd.PageSize)
		if res.Pages != pages || res.Faults != pages/batch || res.Mismatches != 0 {
			t.Errorf("batch %d: %+v, want %d pages, %d faults", batch, res, pages, pages/batch)
		}
		if res.P50 <= 0 || res.P99 < res.P50 {
			t.Errorf("batch %d: latencies p50 %v p99 %v", batch, res.P50, res.P99)
		}
		if !strings.Contains(out.String(), "p50") || !strings.Contains(out.String(), "faults served") {
			t.Errorf("output lacks the summary:\n%s", &out)
		}
		t.Logf("batch %d:\n%s", batch, &out)
	}
}

// TestRunDefaultSize is the demo as memagent runs it: 256 MiB.
func TestRunDefaultSize(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skips the 256 MiB run")
	}
	skipUnlessUFFD(t)
	var out bytes.Buffer
	res, err := Run(context.Background(), &out, Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	if want := DefaultSize / int(userfaultfd.PageSize); res.Faults != want || res.Pages != want {
		t.Errorf("%+v, want %d faults", res, want)
	}
	t.Logf("\n%s", &out)
}

func TestRunDetectsCorruption(t *testing.T) {
	skipUnlessUFFD(t)
	var out bytes.Buffer
	res, err := Run(context.Background(), &out, Options{Size: 1 << 20, corruptPage: 5})
	if !errors.Is(err, ErrMismatch) || res.Mismatches != 1 {
		t.Fatalf("corrupted page: %+v, %v; want 1 mismatch and ErrMismatch", res, err)
	}
}

func TestRunCancelled(t *testing.T) {
	skipUnlessUFFD(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, &bytes.Buffer{}, Options{Size: 1 << 20}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{{Size: -1}, {Batch: 65}, {Batch: -1}} {
		if _, err := Run(context.Background(), &bytes.Buffer{}, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
