// Package swaptest holds what the tests of the swap packages share. It is
// for tests only.
package swaptest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// LockPath is the host-wide lock file of the swap tests.
const LockPath = "/run/rmem/swap-tests.lock"

// Lock serializes the tests that use or need the absence of the host's
// swap, across test processes (go test runs packages in parallel, and two
// go test runs may overlap): the kernel's swap is global. Call it before
// registering other cleanups: its own cleanup then runs after them.
func Lock(tb testing.TB) {
	tb.Helper()
	if err := os.MkdirAll("/run/rmem", 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() })
}
