package userfaultfd

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// TestOpenUserMode, as any user: a user-mode-only uffd serves the
// process's own accesses to a registered page, and the kernel's access to
// a missing one (read(2) into it) fails with EFAULT instead of waiting.
func TestOpenUserMode(t *testing.T) {
	defer goleak.VerifyNone(t)
	// The test faults in Go code of its own process: the serving goroutine
	// needs a P of its own while the faulting thread holds one (under
	// GOMAXPROCS=1 the two would wait on each other).
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	u, err := OpenUserMode(0)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("kernel cannot do this test: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	region, err := unix.Mmap(-1, 0, 2*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(region)
	base := AddrOf(region)
	if _, err := u.Register(Range{base, uint64(len(region))}, ModeMissing); err != nil {
		t.Fatal(err)
	}
	p, err := NewPoller(u)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	page := bytes.Repeat([]byte{0xab}, ps)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, make([]Msg, 4), func(batch []Msg) error {
			for i := range batch {
				ev, err := batch[i].Decode()
				if err != nil {
					return err
				}
				if ev.Kind != EventPagefault || ev.Addr.RoundDown(uint64(ps)) != base {
					return errors.New("a fault outside the first page: " + ev.Addr.String())
				}
				if _, err := u.Copy(base, page, 0); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	got := make(chan byte)
	go func() {
		runtime.LockOSThread() // the fault blocks this thread, not another goroutine's
		defer runtime.UnlockOSThread()
		got <- region[100]
	}()
	if b := <-got; b != 0xab {
		t.Errorf("page served with %#x, want 0xab", b)
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	unix.Write(fds[1], []byte("x"))
	if _, err := unix.Read(fds[0], region[ps:ps+1]); !errors.Is(err, unix.EFAULT) {
		t.Errorf("read(2) into a missing page of a user-mode uffd: %v, want EFAULT", err)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
