package pager

import (
	"fmt"

	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

// faultFD is what a client's loop needs of the kernel for the process it
// serves: the userfaultfd it reads faults and events from and resolves
// them with. *userfaultfd.UFFD is the real one; pagertest.Kernel is a fake
// with which the loop's fault, eviction, budget and lost-page paths run as
// ordinary tests, without root or a kernel feature (core_test.go). The
// errors are the kernel's: userfaultfd.IsExist, IsMMChanged and IsGone
// say what they mean.
type faultFD interface {
	Fd() int // pollable: readable while messages wait
	ReadEvents(msgs []userfaultfd.Msg) (int, error)
	Copy(dst userfaultfd.Addr, src []byte, flags userfaultfd.Flags) (int, error)
	ZeroPage(r userfaultfd.Range, flags userfaultfd.Flags) (int, error)
	Poison(r userfaultfd.Range, flags userfaultfd.Flags) (int, error)
	WriteProtect(r userfaultfd.Range) error
	Unprotect(r userfaultfd.Range, flags userfaultfd.Flags) error
	Wake(r userfaultfd.Range) error
	Close() error
}

var _ faultFD = (*userfaultfd.UFFD)(nil)

// errForkAhead: a FORK event has been read and is not handled yet.
// Reading it ended the kernel's refusal (EAGAIN) of ioctls that install
// pages, but a page installed now would be the parent's alone (the child's
// page tables were copied when the event was raised) while the child's
// copy of our page table, made when the event is handled, would say it is
// mapped: the child would read zeros there. This holds for the faults read
// with the event too: the kernel hands faults out before events, so a
// batch's faults come before its FORK although their pages were missing
// when the child's page tables were copied. So nothing is installed until
// every FORK read is handled, as if the kernel still refused.
var errForkAhead = fmt.Errorf("pager: a FORK event read is not handled yet: %w", unix.EAGAIN)

// gatedUFFD is a client's uffd whose ioctls that install pages (Copy,
// ZeroPage, Poison) fail with errForkAhead while a FORK event it has read
// is not handled (forkHandled): the one place that keeps the rule of
// errForkAhead.
type gatedUFFD struct {
	faultFD
	forks int // FORK events read and not handled yet
}

// ReadEvents reads messages as faultFD does, counting the FORK events.
func (g *gatedUFFD) ReadEvents(msgs []userfaultfd.Msg) (int, error) {
	n, err := g.faultFD.ReadEvents(msgs)
	for i := range msgs[:max(n, 0)] {
		if msgs[i].Kind() == userfaultfd.EventFork {
			g.forks++
		}
	}
	return n, err
}

// forkHandled says a FORK event read has been handled (or dropped).
func (g *gatedUFFD) forkHandled() {
	if g.forks > 0 {
		g.forks--
	}
}

// forkAhead reports whether a FORK event read is not handled yet.
func (g *gatedUFFD) forkAhead() bool { return g.forks > 0 }

func (g *gatedUFFD) Copy(dst userfaultfd.Addr, src []byte, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	return g.faultFD.Copy(dst, src, flags)
}

func (g *gatedUFFD) ZeroPage(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	return g.faultFD.ZeroPage(r, flags)
}

func (g *gatedUFFD) Poison(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	return g.faultFD.Poison(r, flags)
}
