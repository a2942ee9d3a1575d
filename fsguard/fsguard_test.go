package fsguard_test

import (
	"encoding/binary"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"rmem/fsguard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// decisions records what the guard asked and answers with allow.
type decisions struct {
	mu    sync.Mutex
	asked []int
	ops   []fsguard.Op
	allow bool
}

func (d *decisions) decide(pid int, _ fsguard.Key, op fsguard.Op) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = append(d.asked, pid)
	d.ops = append(d.ops, op)
	return d.allow
}

func newGuard(t *testing.T, d *decisions) (*fsguard.Guard, *os.File) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("fanotify permission events need CAP_SYS_ADMIN (run as root)")
	}
	g, err := fsguard.New(d.decide)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	f, err := os.CreateTemp("", "fsguard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	if _, err := f.WriteString("guarded bytes"); err != nil {
		t.Fatal(err)
	}
	if err := g.Watch(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	return g, f
}

// An open by another process waits for the decision, and fails with EPERM
// when refused; this process's own opens are not asked about.
func TestGuardDecidesOthersOpens(t *testing.T) {
	d := &decisions{}
	_, f := newGuard(t, d)

	own, err := os.ReadFile(f.Name())
	if err != nil || string(own) != "guarded bytes" {
		t.Fatalf("own open: %q, %v", own, err)
	}

	cmd := exec.Command("cat", f.Name())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not permitted") {
		t.Fatalf("refused open: cat says %q, %v", out, err)
	}
	d.mu.Lock()
	asked := append([]int(nil), d.asked...)
	d.allow = true
	d.mu.Unlock()
	if len(asked) != 1 || asked[0] != cmd.Process.Pid {
		t.Fatalf("asked for %v, want [%d] (cat's pid)", asked, cmd.Process.Pid)
	}

	cmd = exec.Command("cat", f.Name())
	out, err = cmd.Output()
	if err != nil || string(out) != "guarded bytes" {
		t.Fatalf("allowed open: cat says %q, %v", out, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.asked[1] != cmd.Process.Pid || d.ops[1] != fsguard.Open || len(d.ops) < 3 || d.ops[2] != fsguard.Read {
		t.Fatalf("asked %v for %v: want cat's open, then its reads", d.ops, d.asked)
	}
}

// A file no longer watched is opened without a decision.
func TestGuardUnwatch(t *testing.T) {
	d := &decisions{}
	g, f := newGuard(t, d)
	if err := g.Unwatch(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cat", f.Name()).Output(); err != nil || string(out) != "guarded bytes" {
		t.Fatalf("unwatched: cat says %q, %v", out, err)
	}
	if len(d.asked) != 0 {
		t.Fatalf("asked for %v after Unwatch", d.asked)
	}
}

func event(evLen uint32, vers uint8, mdLen uint16, mask uint64, fd, pid int32) []byte {
	b := make([]byte, 24)
	binary.NativeEndian.PutUint32(b[0:], evLen)
	b[4] = vers
	binary.NativeEndian.PutUint16(b[6:], mdLen)
	binary.NativeEndian.PutUint64(b[8:], mask)
	binary.NativeEndian.PutUint32(b[16:], uint32(fd))
	binary.NativeEndian.PutUint32(b[20:], uint32(pid))
	return b
}

func TestParseEvents(t *testing.T) {
	two := append(event(24, unix.FANOTIFY_METADATA_VERSION, 24, unix.FAN_OPEN_PERM, 7, 100),
		append(event(32, unix.FANOTIFY_METADATA_VERSION, 24, unix.FAN_OPEN_PERM, 8, 101), make([]byte, 8)...)...)
	evs, err := fsguard.ParseEvents(two)
	if err != nil || len(evs) != 2 || evs[0].Fd != 7 || evs[1].Pid != 101 {
		t.Fatalf("two events: %+v, %v", evs, err)
	}
	for name, b := range map[string][]byte{
		"short":         event(24, 3, 24, 0, 1, 1)[:20],
		"version":       event(24, 2, 24, 0, 1, 1),
		"metadata long": event(24, 3, 28, 0, 1, 1),
		"event past":    event(40, 3, 24, 0, 1, 1),
		"metadata tiny": event(24, 3, 8, 0, 1, 1),
	} {
		if _, err := fsguard.ParseEvents(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// FuzzParseEvents: any bytes parse or fail cleanly, and every event parsed
// lies inside them.
func FuzzParseEvents(f *testing.F) {
	f.Add(event(24, unix.FANOTIFY_METADATA_VERSION, 24, unix.FAN_OPEN_PERM, 7, 100))
	f.Add(event(0, unix.FANOTIFY_METADATA_VERSION, 0, 0, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, _ := fsguard.ParseEvents(b)
		if len(evs)*24 > len(b) {
			t.Fatalf("%d events from %d bytes", len(evs), len(b))
		}
	})
}
