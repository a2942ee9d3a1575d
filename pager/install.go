package pager

import (
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

// Installs: a page mapped from a buffer, the zero page, a staging slot,
// or poisoned; an ioctl refused while the address space changes retried
// (again); faults held for an eviction in flight or a retry.

// again reports whether an ioctl refused with EAGAIN is worth retrying at
// once. The kernel refuses while a REMOVE/UNMAP event of the client (its
// helper's madvise, a munmap) is unread: reading the pending messages now
// (handled later, in order, by serveUFFD) lifts that, so the page just
// fetched is installed instead of being fetched again on a later retry.
// Not when a FORK is among them (errForkAhead).
func (c *client) again(err error) bool {
	if !userfaultfd.IsMMChanged(err) || c.uffd.forkAhead() || len(c.fq.early) == cap(c.fq.early) {
		return false
	}
	n, rerr := c.uffd.ReadEvents(c.fq.early[len(c.fq.early):cap(c.fq.early)])
	if rerr != nil || n == 0 {
		return false
	}
	c.fq.early = c.fq.early[:len(c.fq.early)+n]
	return !c.uffd.forkAhead()
}

// zeroFill maps the zero page at a. It returns err nil when the page is
// mapped, with mapped true if this call mapped it (false: it was mapped
// before, EEXIST, and the thread is woken), else the error (IsMMChanged:
// retry after reading events; IsGone: nothing to do).
func (c *client) zeroFill(a userfaultfd.Addr, since time.Time) (mapped bool, err error) {
	_, err = c.uffd.ZeroPage(pageRange(a), 0)
	if c.again(err) {
		_, err = c.uffd.ZeroPage(pageRange(a), 0)
	}
	switch {
	case err == nil:
		mapped = true
		c.st.zeroFills.Add(1)
	case userfaultfd.IsExist(err):
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsMMChanged(err), userfaultfd.IsGone(err):
		return false, err
	default:
		c.log.Error("zeropage failed", zap.Stringer("addr", a), zap.Error(err))
		return false, err
	}
	c.observeZeroFill(since)
	return mapped, nil
}

type heldFault struct {
	pageRef
	flags userfaultfd.FaultFlags
	since time.Time
}

func (c *client) hold(list *[]heldFault, h heldFault) {
	// A fault can come again while it is held (a signal interrupted the
	// thread's wait, and it faulted anew: the Go runtime preempts every
	// 10 ms): one entry per page, as old as the first fault, so that a
	// wait is bounded from when it began (FaultTimeout).
	for i := range *list {
		if e := &(*list)[i]; e.pageRef == h.pageRef {
			if h.since.Before(e.since) {
				e.since = h.since
			}
			e.flags |= h.flags
			return
		}
	}
	if list == &c.fq.held {
		c.st.held.Add(1)
	}
	if len(*list) == cap(*list) {
		// Full: let the thread fault again later.
		c.uffd.Wake(pageRange(h.addr()))
		return
	}
	*list = append(*list, h)
}

// install maps buf at page idx of r, write-protected (clean until a WP
// fault says otherwise) unless write (then dirty from the start: see
// readRef.write), and makes p, the page's entry, Resident and referenced
// (prefetched pages too: the stream is about to use them, CLOCK must not
// take them first), and hot if it came back as a ghost (FaultedIn). It
// returns nil as well when the page's range is gone; another error means
// nothing was installed (IsMMChanged: retry after reading events).
func (c *client) install(r *region, idx int, p Page, buf []byte, write bool) error {
	a := r.addr(idx)
	_, err := c.uffd.Copy(a, buf, installFlags(write))
	if c.again(err) {
		_, err = c.uffd.Copy(a, buf, installFlags(write))
	}
	switch {
	case err == nil:
		c.installed(r, idx, p, write)
	case userfaultfd.IsExist(err):
		// Mapped already, not by us: a child forked without FORK
		// events inherited it, after the copy of our page table that
		// FORK_PREPARE made, and may have written it. Dirty: its
		// contents go to the pool when it is evicted.
		c.dirty(r, idx, p.FaultedIn())
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsGone(err):
	default:
		return err
	}
	return nil
}

func installFlags(write bool) userfaultfd.Flags {
	if write {
		return 0
	}
	return userfaultfd.WriteProtected
}

// installed records page idx of r, whose entry was p, as mapped from the
// pool: clean (its pool copy kept) or, installed writable, dirty (the copy
// let go: it is written when evicted).
func (c *client) installed(r *region, idx int, p Page, write bool) {
	if write {
		c.dirty(r, idx, p.FaultedIn())
		return
	}
	r.wr.fetchedClean()
	c.set(r, idx, p.FaultedIn())
}

// poison makes page idx raise SIGBUS: no replica holds a good copy of its
// data (gone, or failed its checksum).
// An IsMMChanged error means: retry after reading events.
func (c *client) poison(r *region, idx int) error {
	return c.poisonAt(r.addr(idx), "no replica holds a good copy of an evicted page (lost, or every copy failed its checksum)",
		zap.Uint64("region", r.id))
}

// poisonAt makes the page at a raise SIGBUS in c's process, for why (said
// in the log with fields): with UFFDIO_POISON the thread that touches it
// gets the signal; without, the process is killed with it. It never lets
// the thread see zeros. An IsMMChanged error means: retry after reading
// events.
func (c *client) poisonAt(a userfaultfd.Addr, why string, fields ...zap.Field) error {
	fields = append([]zap.Field{zap.Int("pid", int(c.pidAtm.Load())), zap.Stringer("addr", a)}, fields...)
	if c.features.Has(userfaultfd.FeaturePoison) {
		c.st.lost.Add(1) // before the ioctl wakes the thread into its SIGBUS
		_, err := c.uffd.Poison(pageRange(a), 0)
		if userfaultfd.IsMMChanged(err) {
			c.st.lost.Add(^uint64(0))
			return err
		}
		c.log.Error("PAGE LOST: "+why+"; the client gets SIGBUS", fields...)
		if err == nil || userfaultfd.IsExist(err) || userfaultfd.IsGone(err) {
			if err != nil {
				c.uffd.Wake(pageRange(a))
			}
			return nil
		}
		c.log.Error("poison failed", zap.Error(err))
	} else {
		c.st.lost.Add(1)
		c.log.Error("PAGE LOST: "+why+"; the client gets SIGBUS (no UFFDIO_POISON: the process is killed)", fields...)
	}
	if pid := int(c.pidAtm.Load()); pid > 0 {
		unix.Kill(pid, unix.SIGBUS)
	}
	return nil
}

// observeFault records the latency of a fault that waited since since,
// served now: one read of the clock. It counts as stall (stallPerFault
// added: the part of the miss the agent does not see).
func (c *client) observeFault(since time.Time) { c.observeMiss(c.a.opts.Now().Sub(since)) }

// observeMiss records the latency d of a fault that was a miss (not a
// first touch), in the latency histogram and, for a client without a
// fault ring, the stall.
func (c *client) observeMiss(d time.Duration) {
	c.st.latency.Observe(d)
	if c.ring == nil { // the ring measures its own, from the post (faultRing.finish)
		c.st.stall.Add(int64(max(d, 0) + stallPerFault))
	}
}

// observeZeroFill records the latency of a first touch that waited since
// since: not a stall of paging (the program would have faulted anyway).
func (c *client) observeZeroFill(since time.Time) { c.st.latency.Observe(c.a.opts.Now().Sub(since)) }

// fromStage installs a page from its staging slot and frees the slot.
func (c *client) fromStage(r *region, idx int, flags userfaultfd.Flags) error {
	slot := c.ev.stageOf(r, idx)
	if slot < 0 {
		c.log.Error("staged page without a slot", zap.Uint64("region", r.id), zap.Int("page", idx))
		return nil
	}
	a := r.addr(idx)
	_, err := c.uffd.Copy(a, c.ev.stageBuf(slot), flags)
	exist := userfaultfd.IsExist(err)
	switch {
	case err == nil:
	case exist:
		c.uffd.Wake(pageRange(a))
	case userfaultfd.IsGone(err):
	default:
		if !userfaultfd.IsMMChanged(err) {
			c.log.Error("copy from staging failed", zap.Error(err))
		}
		return err
	}
	p := r.pages[idx]
	if p.State() == Staged {
		c.ev.staged--
	}
	if p.State() == Staged || exist { // mapped already, not by us: see installRead
		c.dirty(r, idx, p.FaultedIn()) // a Staged page's slot was never written
	} else {
		c.set(r, idx, p.FaultedIn())
	}
	c.freeStage(slot)
	return nil
}
