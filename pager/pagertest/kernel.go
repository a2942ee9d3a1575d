package pagertest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// PageSize is the page size of a Kernel's address space.
const PageSize = 4096

// ErrSIGBUS is what a thread's access to a poisoned page returns: the
// signal a real process would get.
var ErrSIGBUS = errors.New("pagertest: SIGBUS")

// ErrNotServed: a thread's fault was not resolved within the Kernel's
// FaultWait.
var ErrNotServed = errors.New("pagertest: fault not served in time")

// Kernel is a fake of the kernel side of one process's userfaultfd, for
// the pager's core tests: an address space of 4 KiB pages, all of it
// registered for MISSING and WP faults, threads that touch it (Load,
// Store) and fault when a page is not mapped or a write finds it
// write-protected, and the ioctls that resolve faults (the methods the
// pager's loop calls on a *userfaultfd.UFFD, with its errors: EEXIST for
// a page mapped already, EAGAIN when a test injects it, ESRCH once the
// process has exited). Fd is an eventfd that is readable while fault
// messages wait, so the loop polls it as it polls a real uffd.
//
// It models what the pager relies on and no more: no REMOVE or UNMAP
// events, FORK events only when a test raises one (ForkEvent), and the
// zero page is an ordinary writable page (as after the kernel's
// copy-on-write of it, which raises no fault either). As the kernel's
// (mmap_changing), its ioctls that change the address space (Copy,
// ZeroPage, Poison, WriteProtect, Unprotect) fail with EAGAIN from a
// FORK event until that event is read.
type Kernel struct {
	// FaultWait bounds how long a thread waits for its fault to be
	// resolved (default 10 s); then its access fails with ErrNotServed.
	FaultWait time.Duration

	mu      sync.Mutex
	cond    *sync.Cond // a wake, an exit, the close: the threads look again
	changed *sync.Cond // counts changed: Await looks again
	efd     int
	queue   []userfaultfd.Msg
	pages   map[userfaultfd.Addr]*fakePage
	poison  map[userfaultfd.Addr]bool
	woken   map[userfaultfd.Addr]uint64 // bumped by each wake of a page
	inject  map[string][]error          // errors the next calls of an op return
	closed  bool
	exited  bool
	held    bool // Hold: messages queue up unread
	forks   int  // FORK events raised and not read: the address space is changing
	counts  KernelCounts
	ring    *ringClient // SIGBUS mode (UseRing): faults go to the fault ring
}

// KernelCounts are what a Kernel saw.
type KernelCounts struct {
	Faults   int // MISSING faults raised
	WPFaults int // write-protect faults raised
	Copies   int // pages installed by Copy
	CopyOps  int // Copy calls
	Zeros    int // pages installed by ZeroPage
	Poisoned int // pages poisoned
	Dropped  int // mapped pages dropped (Drop: the helper's MADV_DONTNEED)
	Accesses int // Load and Store calls that completed (not those that failed)
	Posted   int // faults posted to the fault ring (SIGBUS mode, UseRing)
}

type fakePage struct {
	data [PageSize]byte
	wp   bool
}

// NewKernel returns an empty address space; Close releases its eventfd.
func NewKernel() (*Kernel, error) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("pagertest: eventfd: %w", err)
	}
	k := &Kernel{efd: efd, pages: map[userfaultfd.Addr]*fakePage{}, poison: map[userfaultfd.Addr]bool{},
		woken: map[userfaultfd.Addr]uint64{}, inject: map[string][]error{}}
	k.cond = sync.NewCond(&k.mu)
	k.changed = sync.NewCond(&k.mu)
	return k, nil
}

func pageOf(a userfaultfd.Addr) userfaultfd.Addr { return a &^ (PageSize - 1) }

// Load is a thread's 8-byte read at a (8-byte aligned).
func (k *Kernel) Load(a userfaultfd.Addr) (uint64, error) {
	var v uint64
	err := k.access(a, false, func(p *fakePage) {
		v = binary.LittleEndian.Uint64(p.data[a-pageOf(a):])
	})
	return v, err
}

// Store is a thread's 8-byte write of v at a (8-byte aligned).
func (k *Kernel) Store(a userfaultfd.Addr, v uint64) error {
	return k.access(a, true, func(p *fakePage) {
		binary.LittleEndian.PutUint64(p.data[a-pageOf(a):], v)
	})
}

// access runs do on a's page once the thread may access it, faulting (and
// waiting for the fault's resolution, then trying again) as the kernel
// would.
func (k *Kernel) access(a userfaultfd.Addr, write bool, do func(*fakePage)) error {
	pg := pageOf(a)
	var deadline time.Time // armed at the first fault
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		switch {
		case k.closed || k.exited:
			return errors.New("pagertest: address space gone")
		case k.poison[pg]:
			return ErrSIGBUS
		}
		p := k.pages[pg]
		if p != nil && (!write || !p.wp) {
			do(p)
			k.counts.Accesses++
			k.changed.Broadcast()
			return nil
		}
		flags := userfaultfd.FaultFlags(0)
		if write {
			flags |= userfaultfd.FaultWrite
		}
		if p != nil {
			flags |= userfaultfd.FaultWP
			k.counts.WPFaults++
		} else {
			k.counts.Faults++
		}
		if deadline.IsZero() && k.ring != nil {
			deadline = time.Now().Add(k.faultWait())
		}
		if r := k.ring; r != nil {
			// SIGBUS mode: the thread's handler posts the fault in the ring
			// and waits there, then the access is tried again.
			k.counts.Posted++
			k.changed.Broadcast() // a fault raised counts as a change
			k.mu.Unlock()
			res, err := r.fault(pg, write, deadline)
			k.mu.Lock()
			switch {
			case err != nil:
				return fmt.Errorf("%w: %s fault at %v", err, map[bool]string{false: "read", true: "write"}[write], pg)
			case res == proto.RingNotMine:
				return ErrNotMine
			}
			continue // RingDone; RingLost: the retried access finds the page poisoned
		}
		k.post(userfaultfd.EncodeMsg(userfaultfd.Event{Kind: userfaultfd.EventPagefault, Addr: pg, Flags: flags}))
		if deadline.IsZero() {
			deadline = time.Now().Add(k.faultWait())
			timer := time.AfterFunc(k.faultWait(), func() {
				k.mu.Lock()
				k.cond.Broadcast()
				k.mu.Unlock()
			})
			defer timer.Stop()
		}
		gen := k.woken[pg]
		for k.woken[pg] == gen && !k.closed && !k.exited {
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: %s fault at %v", ErrNotServed, map[bool]string{false: "read", true: "write"}[write], pg)
			}
			k.cond.Wait()
		}
	}
}

func (k *Kernel) faultWait() time.Duration {
	if k.FaultWait > 0 {
		return k.FaultWait
	}
	return 10 * time.Second
}

// post queues m and makes Fd readable unless held (k.mu held).
func (k *Kernel) post(m userfaultfd.Msg) {
	k.changed.Broadcast() // a fault raised (or a FORK) counts as a change
	k.queue = append(k.queue, m)
	if !k.held {
		k.readable()
	}
}

// readable makes Fd readable (k.mu held).
func (k *Kernel) readable() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(k.efd, one[:])
}

// wake wakes the threads waiting on r's pages (k.mu held).
func (k *Kernel) wake(r userfaultfd.Range) {
	for pg := r.Start; pg < r.Start+userfaultfd.Addr(r.Len); pg += PageSize {
		k.woken[pg]++
	}
	k.cond.Broadcast()
}

// Inject makes the next calls of op ("copy", "zeropage", "poison",
// "writeprotect", "unprotect") fail with errs in turn, doing nothing.
func (k *Kernel) Inject(op string, errs ...error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inject[op] = append(k.inject[op], errs...)
}

func (k *Kernel) injected(op string) error {
	if len(k.inject[op]) == 0 {
		return nil
	}
	err := k.inject[op][0]
	k.inject[op] = k.inject[op][1:]
	return err
}

// Exit ends the process: its threads' accesses fail, and the ioctls
// fail with ESRCH.
func (k *Kernel) Exit() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.exited = true
	k.cond.Broadcast()
}

// Fork returns the address space of a child forked now, as fork(2) makes
// it for a process whose child registers its ranges with a uffd of its
// own (no FORK event): the mapped pages copied, none write-protected (the
// child's registration starts without uffd-wp bits), the missing ones
// missing. Close releases its eventfd.
func (k *Kernel) Fork() (*Kernel, error) { return k.fork(false) }

// ForkEvent forks the process as fork(2) does one whose uffd has FORK
// events: the child's address space (returned) is a copy of the mapped
// pages, their write protection kept (its ranges stay registered), the
// missing ones missing; and a FORK message naming the child's Fd is
// queued after the messages waiting. The loop must map that descriptor
// to the child Kernel (the test's hook). Close releases its eventfd.
func (k *Kernel) ForkEvent() (*Kernel, error) { return k.fork(true) }

// fork copies k's mapped pages into a new Kernel, keeping their write
// protection and raising a FORK event if event.
func (k *Kernel) fork(event bool) (*Kernel, error) {
	child, err := NewKernel()
	if err != nil {
		return nil, err
	}
	child.FaultWait = k.FaultWait
	k.mu.Lock()
	defer k.mu.Unlock()
	for a, p := range k.pages {
		child.pages[a] = &fakePage{data: p.data, wp: event && p.wp}
	}
	if event {
		k.forks++
		k.post(userfaultfd.EncodeMsg(userfaultfd.Event{Kind: userfaultfd.EventFork, FD: child.efd}))
	}
	return child, nil
}

// Hold keeps the messages raised from now on unread (ReadEvents finds
// none, Fd is not readable) until Release: a test gathers messages into
// one batch, as the kernel's queue does while the loop is busy.
func (k *Kernel) Hold() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held = true
	var b [8]byte
	unix.Read(k.efd, b[:])
}

// Release ends Hold: the messages queued meanwhile are read in one batch.
func (k *Kernel) Release() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held = false
	if len(k.queue) > 0 {
		k.readable()
	}
}

// Await waits until cond holds of the Kernel's counts, checked now and
// at each change of them (a fault raised, an access done, a page
// installed, poisoned or dropped), for at most d; it reports whether cond
// held. cond runs with the Kernel locked: it must not call its methods.
func (k *Kernel) Await(d time.Duration, cond func(KernelCounts) bool) bool {
	late := false
	t := time.AfterFunc(d, func() {
		k.mu.Lock()
		late = true
		k.changed.Broadcast()
		k.mu.Unlock()
	})
	defer t.Stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for !cond(k.counts) {
		if late {
			return false
		}
		k.changed.Wait()
	}
	return true
}

// Queued returns how many messages wait to be read.
func (k *Kernel) Queued() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.queue)
}

// Mapped reports whether a's page is mapped, and write-protected.
func (k *Kernel) Mapped(a userfaultfd.Addr) (mapped, wp bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pages[pageOf(a)]
	return p != nil, p != nil && p.wp
}

// Resident returns how many pages are mapped.
func (k *Kernel) Resident() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.pages)
}

// Counts returns what the Kernel saw so far.
func (k *Kernel) Counts() KernelCounts {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.counts
}

// CopyOut copies a's page into dst (the helper thread's copy to a
// staging slot); false if the page is not mapped.
func (k *Kernel) CopyOut(a userfaultfd.Addr, dst []byte) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pages[pageOf(a)]
	if p == nil {
		return false
	}
	copy(dst, p.data[:])
	return true
}

// Drop unmaps r's pages, as madvise(MADV_DONTNEED) does (no event: the
// pager's clients do not ask for REMOVE events).
func (k *Kernel) Drop(r userfaultfd.Range) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for pg := r.Start; pg < r.Start+userfaultfd.Addr(r.Len); pg += PageSize {
		if k.pages[pg] != nil {
			k.counts.Dropped++
			delete(k.pages, pg)
		}
	}
	k.changed.Broadcast()
}

// Fd returns the eventfd the loop polls.
func (k *Kernel) Fd() int { return k.efd }

// ReadEvents returns the messages waiting, EAGAIN if none.
func (k *Kernel) ReadEvents(msgs []userfaultfd.Msg) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return 0, unix.EBADF
	}
	if len(k.queue) == 0 || k.held {
		return 0, unix.EAGAIN
	}
	n := copy(msgs, k.queue)
	for i := range msgs[:n] {
		if msgs[i].Kind() == userfaultfd.EventFork {
			k.forks-- // read: the ioctls work again (as after the kernel's mmap_changing)
		}
	}
	k.queue = k.queue[:copy(k.queue, k.queue[n:])]
	if len(k.queue) == 0 {
		var b [8]byte
		unix.Read(k.efd, b[:]) // not readable until the next post
	}
	return n, nil
}

func (k *Kernel) check(op string, r userfaultfd.Range) error {
	switch {
	case k.closed:
		return unix.EBADF
	case k.exited:
		return unix.ESRCH
	case r.Len == 0 || r.Len%PageSize != 0 || r.Start%PageSize != 0:
		return fmt.Errorf("pagertest: %s of %v: %w", op, r, unix.EINVAL)
	case k.forks > 0 && op != "wake":
		return unix.EAGAIN // a FORK event not read yet
	}
	return k.injected(op)
}

// Copy maps src's pages at dst, write-protected with WriteProtected, and
// wakes them unless DontWake. A page mapped already stops it with EEXIST
// (the bytes before it stay copied, as the kernel's partial copy).
func (k *Kernel) Copy(dst userfaultfd.Addr, src []byte, flags userfaultfd.Flags) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := userfaultfd.Range{Start: dst, Len: uint64(len(src))}
	if err := k.check("copy", r); err != nil {
		return 0, err
	}
	k.counts.CopyOps++
	return k.install(r, flags, func(off int, p *fakePage) {
		copy(p.data[:], src[off:off+PageSize])
		p.wp = flags&userfaultfd.WriteProtected != 0
		k.counts.Copies++
	})
}

// install maps r's pages, filled by fill (given each page's offset in r),
// until one is mapped already (EEXIST), and wakes the ones it mapped
// unless DontWake; it returns the bytes mapped (k.mu held).
func (k *Kernel) install(r userfaultfd.Range, flags userfaultfd.Flags, fill func(off int, p *fakePage)) (int, error) {
	done := 0
	var err error
	for ; uint64(done) < r.Len; done += PageSize {
		pg := r.Start + userfaultfd.Addr(done)
		if k.pages[pg] != nil || k.poison[pg] {
			err = unix.EEXIST
			break
		}
		p := &fakePage{}
		fill(done, p)
		k.pages[pg] = p
	}
	if flags&userfaultfd.DontWake == 0 && done > 0 {
		k.wake(userfaultfd.Range{Start: r.Start, Len: uint64(done)})
	}
	k.changed.Broadcast()
	return done, err
}

// ZeroPage maps zeroed pages over r and wakes them unless DontWake.
func (k *Kernel) ZeroPage(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check("zeropage", r); err != nil {
		return 0, err
	}
	return k.install(r, flags, func(int, *fakePage) { k.counts.Zeros++ })
}

// Poison makes r's pages raise SIGBUS and wakes them.
func (k *Kernel) Poison(r userfaultfd.Range, flags userfaultfd.Flags) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check("poison", r); err != nil {
		return 0, err
	}
	for pg := r.Start; pg < r.Start+userfaultfd.Addr(r.Len); pg += PageSize {
		if k.pages[pg] != nil {
			return int(pg - r.Start), unix.EEXIST
		}
		k.poison[pg] = true
		k.counts.Poisoned++
	}
	k.changed.Broadcast()
	k.wake(r)
	return int(r.Len), nil
}

// WriteProtect write-protects r's mapped pages.
func (k *Kernel) WriteProtect(r userfaultfd.Range) error {
	return k.protect("writeprotect", r, true, 0)
}

// protectVictim write-protects the page at a if it is mapped, as the
// shim's helper does to a ring client's dirty victim before it copies it
// (pager/evict.go's protectDirty leaves that to the helper), and reports
// whether the process is in SIGBUS mode: only then does it. No injected
// error: those are for the agent's calls.
func (k *Kernel) protectVictim(a userfaultfd.Addr) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ring == nil {
		return false
	}
	if p := k.pages[a]; p != nil {
		p.wp = true
	}
	return true
}

// Unprotect lifts r's write protection and wakes it unless DontWake.
func (k *Kernel) Unprotect(r userfaultfd.Range, flags userfaultfd.Flags) error {
	return k.protect("unprotect", r, false, flags)
}

func (k *Kernel) protect(op string, r userfaultfd.Range, wp bool, flags userfaultfd.Flags) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check(op, r); err != nil {
		return err
	}
	for pg := r.Start; pg < r.Start+userfaultfd.Addr(r.Len); pg += PageSize {
		if p := k.pages[pg]; p != nil {
			p.wp = wp
		}
	}
	if !wp && flags&userfaultfd.DontWake == 0 {
		k.wake(r)
	}
	return nil
}

// Wake wakes the threads waiting on r.
func (k *Kernel) Wake(r userfaultfd.Range) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check("wake", r); err != nil {
		return err
	}
	k.wake(r)
	return nil
}

// Close is the loop's close of its uffd: threads still waiting fail, and
// the eventfd is closed.
func (k *Kernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	k.cond.Broadcast()
	if k.ring != nil {
		k.ring.close() // its page stays mapped: a thread may still look at its entry
	}
	return unix.Close(k.efd)
}
