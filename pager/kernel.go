package pager

import "rmem/userfaultfd"

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
