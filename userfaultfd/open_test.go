package userfaultfd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// TestOpenFallsBackToSyscall: without the device node, the system call
// still gives a working uffd.
func TestOpenFallsBackToSyscall(t *testing.T) {
	openOrSkip(t, 0)
	fd, err := newFDFrom(filepath.Join(t.TempDir(), "no-such-device"))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	api := uffdioAPI{API: uffdAPI}
	if e := ioctlAPI(fd, &api); e != 0 {
		t.Fatalf("handshake on the syscall fd: %v", e)
	}
}

// TestOpenUnprivileged runs Open as user nobody: it must fail with
// ErrUnavailable, keep the errno, and say what to check.
func TestOpenUnprivileged(t *testing.T) {
	openOrSkip(t, 0)
	if out, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); strings.TrimSpace(string(out)) != "0" {
		t.Skip("vm.unprivileged_userfaultfd allows unprivileged users")
	}
	// The test binary must be reachable by nobody.
	dir, err := os.MkdirTemp("", "uffd-unpriv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "test")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+`={"Scenario":"open"}`)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	err = cmd.Run()
	msg := stderr.String()
	if err == nil {
		t.Fatalf("Open as nobody succeeded: %s", msg)
	}
	for _, want := range []string{"not available", "/dev/userfaultfd", "vm.unprivileged_userfaultfd", "operation not permitted"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
}

// childOpen is the "open" child scenario: report Open's error.
func childOpen() error {
	_, err := Open(0)
	if err == nil {
		return errors.New("Open succeeded")
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.EPERM) {
		return errors.New("wrong error class: " + err.Error())
	}
	return err
}

// TestNonCooperativeEvents: madvise(DONTNEED), mremap and munmap of a
// registered range deliver REMOVE, REMAP and UNMAP messages; the thread
// doing them waits until the message is read.
func TestNonCooperativeEvents(t *testing.T) {
	defer goleak.VerifyNone(t)
	u := openOrSkip(t, FeatureEventRemove|FeatureEventRemap|FeatureEventUnmap)
	const pages = 8
	region, err := unix.Mmap(-1, 0, pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	base := AddrOf(region)
	if _, err := u.Register(Range{base, uint64(len(region))}, ModeMissing); err != nil {
		t.Fatal(err)
	}
	p, err := NewPoller(u)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	events := make(chan Event, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, make([]Msg, 4), func(batch []Msg) error {
			for i := range batch {
				ev, err := batch[i].Decode()
				if err != nil {
					return err
				}
				events <- ev
			}
			return nil
		})
	}()
	next := func(kind EventKind) Event {
		t.Helper()
		select {
		case ev := <-events:
			if ev.Kind != kind {
				t.Fatalf("got %v event, want %v", ev.Kind, kind)
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v event", kind)
		}
		return Event{}
	}
	// madvise runs in a system call: it may wait for the server safely.
	if err := unix.Madvise(region[2*ps:4*ps], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if ev := next(EventRemove); ev.Range != (Range{base + Addr(2*ps), uint64(2 * ps)}) {
		t.Errorf("REMOVE range %v", ev.Range)
	}
	// mremap of the whole region onto a destination this test reserved
	// (MREMAP_FIXED replaces whatever is mapped there).
	dst, err := unix.Mmap(-1, 0, pages*ps, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	newAddr, _, e := unix.Syscall6(unix.SYS_MREMAP, uintptr(base), uintptr(pages*ps), uintptr(pages*ps),
		unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, uintptr(AddrOf(dst)), 0)
	if e != 0 {
		t.Fatalf("mremap: %v", e)
	}
	moved := Addr(newAddr)
	if moved != base {
		if ev := next(EventRemap); ev.From != base || ev.To != moved || ev.Len != uint64(pages*ps) {
			t.Errorf("REMAP %+v, want %v → %v len %d", ev, base, moved, pages*ps)
		}
	}
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(moved), uintptr(pages*ps), 0); e != 0 {
		t.Fatalf("munmap: %v", e)
	}
	// mremap may itself report the old range as unmapped.
	ev := next(EventUnmap)
	if ev.Range == (Range{base, uint64(pages * ps)}) && moved != base {
		ev = next(EventUnmap)
	}
	if ev.Range != (Range{moved, uint64(pages * ps)}) {
		t.Errorf("UNMAP range %v, want %v+%d", ev.Range, moved, pages*ps)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
