package pager

import (
	"fmt"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
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
// errForkAhead. For a client whose faults come through the fault ring, it
// is also where their threads are woken: what wakes a thread waiting in
// the kernel (an install, a wake, an unprotect; a poison) completes the
// ring's entries of those pages (ring.go).
type gatedUFFD struct {
	faultFD
	forks int        // FORK events read and not handled yet
	ring  *faultRing // nil: the faults come from the uffd
}

// woken completes the ring's faults on r's pages, as the kernel wakes the
// threads faulting there, when an ioctl with flags succeeded.
func (g *gatedUFFD) woken(r userfaultfd.Range, flags userfaultfd.Flags, err error) {
	if g.ring != nil && err == nil && flags&userfaultfd.DontWake == 0 {
		g.ring.complete(r, proto.RingDone)
	}
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
	n, err := g.faultFD.Copy(dst, src, flags)
	if n > 0 && err != nil && g.ring != nil && flags&userfaultfd.DontWake == 0 {
		g.ring.complete(userfaultfd.Range{Start: dst, Len: uint64(n)}, proto.RingDone) // the part copied
	}
	g.woken(userfaultfd.Range{Start: dst, Len: uint64(len(src))}, flags, err)
	return n, err
}

func (g *gatedUFFD) ZeroPage(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	n, err := g.faultFD.ZeroPage(r, flags)
	g.woken(r, flags, err)
	return n, err
}

func (g *gatedUFFD) Poison(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	if g.forkAhead() {
		return 0, errForkAhead
	}
	n, err := g.faultFD.Poison(r, flags)
	if g.ring != nil && err == nil {
		g.ring.complete(r, proto.RingLost) // the retried access raises the lost page's SIGBUS
	}
	return n, err
}

func (g *gatedUFFD) Unprotect(r userfaultfd.Range, flags userfaultfd.Flags) error {
	err := g.faultFD.Unprotect(r, flags)
	g.woken(r, flags, err)
	return err
}

func (g *gatedUFFD) Wake(r userfaultfd.Range) error {
	err := g.faultFD.Wake(r)
	if g.ring != nil {
		g.ring.complete(r, proto.RingDone) // whatever the kernel said: the thread retries
	}
	return err
}
