package traced

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// errno results of injected calls are returned as unix.Errno.
func result(rax uint64) (uint64, error) {
	if r := int64(rax); r < 0 && r >= -4095 {
		return 0, unix.Errno(-r)
	}
	return rax, nil
}

// inject runs system call nr with args in thread tid, which is in a
// ptrace stop that may change its registers, from the syscall/int3 pair
// at site, and returns its result. The thread's registers are left as
// the int3 stop had them: the caller restores its own.
func inject(tid int, base *unix.PtraceRegs, site uint64, nr uint64, args ...uint64) (uint64, error) {
	r := *base
	r.Rip, r.Rax, r.Orig_rax = site, nr, ^uint64(0)
	regs := []*uint64{&r.Rdi, &r.Rsi, &r.Rdx, &r.R10, &r.R8, &r.R9}
	for i, a := range args {
		*regs[i] = a
	}
	if err := unix.PtraceSetRegs(tid, &r); err != nil {
		return 0, fmt.Errorf("traced: set registers of %d: %w", tid, err)
	}
	if err := unix.PtraceCont(tid, 0); err != nil {
		return 0, fmt.Errorf("traced: resume %d: %w", tid, err)
	}
	if err := waitTrap(tid); err != nil {
		return 0, err
	}
	if err := unix.PtraceGetRegs(tid, &r); err != nil {
		return 0, fmt.Errorf("traced: registers of %d: %w", tid, err)
	}
	return result(r.Rax)
}

// errGone: the thread exited (or was killed) under the tracer.
var errGone = errors.New("traced: the program exited during set-up")

// waitTrap waits for tid's SIGTRAP stop (the int3 after an injected
// call), letting the injected call through the seccomp filter.
func waitTrap(tid int) error {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(tid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("traced: wait for %d: %w", tid, err)
		}
		switch {
		case ws.Exited() || ws.Signaled():
			return errGone
		case ws.Stopped() && ws.StopSignal() == unix.SIGTRAP && ws.TrapCause() <= 0:
			return nil
		case ws.Stopped() && ws.StopSignal() == unix.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_SECCOMP:
			// The filter stops an injected call made from outside the
			// code page (the first ones after an exec): it goes on.
			if err := unix.PtraceCont(tid, 0); err != nil {
				return fmt.Errorf("traced: resume %d: %w", tid, err)
			}
		case ws.Stopped():
			return fmt.Errorf("traced: thread %d stopped by %v (event %d) during an injected call", tid, ws.StopSignal(), ws.TrapCause())
		}
	}
}

// poke writes b at addr of tid's memory (PTRACE_POKEDATA: pages that are
// not writable too), a word at a time; b is padded with the bytes there.
func poke(tid int, addr uint64, b []byte) error {
	for off := 0; off < len(b); off += 8 {
		var w [8]byte
		if _, err := unix.PtracePeekData(tid, uintptr(addr)+uintptr(off), w[:]); err != nil {
			return fmt.Errorf("traced: peek %#x: %w", addr+uint64(off), err)
		}
		copy(w[:], b[off:])
		if _, err := unix.PtracePokeData(tid, uintptr(addr)+uintptr(off), w[:]); err != nil {
			return fmt.Errorf("traced: poke %#x: %w", addr+uint64(off), err)
		}
	}
	return nil
}
