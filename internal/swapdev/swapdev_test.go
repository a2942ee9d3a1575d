package swapdev

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"rmem/internal/swaptest"
)

func TestParseSwaps(t *testing.T) {
	in := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" +
		"/dev/loop3                              partition\t262140\t\t1024\t\t100\n" +
		"/swap\\040file                           file\t\t1048572\t\t0\t\t-2\n"
	got, err := ParseSwaps([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Swap{
		{Device: "/dev/loop3", Type: "partition", Size: 262140, Used: 1024, Priority: 100},
		{Device: "/swap file", Type: "file", Size: 1048572, Used: 0, Priority: -2},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseSwaps = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "garbage\n", "Filename Type Size Used Priority\n/dev/x partition 1 2\n",
		"Filename Type Size Used Priority\n/dev/x partition a 2 3\n"} {
		if _, err := ParseSwaps([]byte(bad)); err == nil {
			t.Errorf("ParseSwaps(%q) accepted", bad)
		}
	}
}

func FuzzParseSwaps(f *testing.F) {
	f.Add([]byte("Filename Type Size Used Priority\n/dev/loop0 partition 4 0 -2\n"))
	f.Add([]byte("Filename\n\\\\\\0 a 1 1 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ss, err := ParseSwaps(b)
		if err != nil && ss != nil {
			t.Fatal("error with swaps")
		}
		for _, s := range ss {
			if s.Device == "" {
				t.Fatalf("empty device in %q", b)
			}
		}
	})
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices and swapon need root")
	}
	for _, c := range []string{"losetup", "mkswap", "swapon", "swapoff"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s not installed", c)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
}

func TestCommandError(t *testing.T) {
	needRoot(t)
	_, err := On(context.Background(), filepath.Join(t.TempDir(), "missing"), -1)
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Cmd, "losetup ") || ce.Output == "" {
		t.Fatalf("On(missing file) = %v, want a losetup CommandError with its output", err)
	}
	if !strings.Contains(err.Error(), ce.Cmd) || !strings.Contains(err.Error(), strings.TrimSpace(ce.Output)) {
		t.Fatalf("error %q does not show the command and its output", err)
	}
}

// TestOnOff swaps on a plain file through a direct-I/O loop device and
// turns it off again, leaving no loop device.
func TestOnOff(t *testing.T) {
	needRoot(t)
	swaptest.Lock(t)
	file := filepath.Join(t.TempDir(), "swapfile")
	if err := os.WriteFile(file, make([]byte, 16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { Off(ctx, file) })
	if err := Off(ctx, file); !errors.Is(err, ErrNotSwap) {
		t.Fatalf("Off before On = %v, want ErrNotSwap", err)
	}
	dev, err := On(ctx, file, 7)
	if err != nil {
		t.Fatal(err)
	}
	s, on, err := Active(dev)
	if err != nil || !on || s.Priority != 7 {
		t.Fatalf("Active(%s) = %+v, %v, %v", dev, s, on, err)
	}
	loops, swap, err := InUse(file)
	if err != nil || !swap || len(loops) != 1 || loops[0].Device != dev || !loops[0].DirectIO {
		t.Fatalf("InUse = %+v, %v, %v", loops, swap, err)
	}
	if _, err := On(ctx, file, 7); err == nil {
		t.Fatal("On twice accepted")
	}
	if err := Off(ctx, file); err != nil {
		t.Fatal(err)
	}
	if _, on, _ := Active(dev); on {
		t.Fatal("swap still active after Off")
	}
	if loops, err := LoopsOf(file); err != nil || len(loops) != 0 {
		t.Fatalf("loop devices left after Off: %+v, %v", loops, err)
	}
}
