package pager

import (
	"errors"
	"io"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// event handles a non-fault uffd message.
func (c *client) event(ev userfaultfd.Event) {
	switch ev.Kind {
	case userfaultfd.EventFork:
		c.fork(ev.FD)
		c.uffd.forkHandled() // installs may go on once every FORK read is handled
	case userfaultfd.EventRemove:
		c.dropRange(ev.Range, false)
	case userfaultfd.EventUnmap:
		c.dropRange(ev.Range, true)
	case userfaultfd.EventRemap:
		c.remap(ev.From, ev.To, ev.Len)
	}
}

// dropRange forgets the pages of rng: after MADV_DONTNEED (REMOVE) they
// read as zeros, after munmap (UNMAP, REGION_DEL) they are gone. Pages
// being evicted are skipped on REMOVE: that is the client's own
// MADV_DONTNEED of the eviction. A region unmapped entirely is dropped
// and its slabs freed.
func (c *client) dropRange(rng userfaultfd.Range, unmap bool) {
	end, ok := rng.End()
	if !ok {
		return
	}
	for i := 0; i < len(c.regs.list); i++ {
		r := c.regs.list[i]
		if end <= r.start || r.end() <= rng.Start {
			continue
		}
		if r.px != nil {
			// A process's mapping of shared memory: a MADV_DONTNEED
			// leaves the data in the segment; an unmap ends (part of)
			// the mapping.
			if unmap && !c.a.shm.cut(r, rng) {
				c.removeRegion(r)
				i--
			}
			continue
		}
		if unmap && rng.Start <= r.start && r.end() <= end {
			c.removeRegion(r)
			i--
			continue
		}
		from := int(uint64(max(rng.Start, r.start)-r.start) / pageSize)
		to := int((uint64(min(end, r.end())-r.start) + pageSize - 1) / pageSize)
		for idx := from; idx < to; idx++ {
			p := r.pages[idx]
			if p.Has(FlagBusy) && !unmap {
				continue
			}
			c.dropPage(r, idx)
		}
	}
}

// dropPage makes page idx Absent, releasing its staging and pool slots.
func (c *client) dropPage(r *region, idx int) {
	p := r.pages[idx]
	if p.State() == Staged {
		c.ev.staged--
		if s := c.ev.stageOf(r, idx); s >= 0 {
			c.freeStage(s)
		}
	}
	if p.Has(FlagSampled) {
		c.unsample(pageRef{r, idx})
	}
	keep := p & FlagBusy // the eviction in flight still owns its staging slot
	c.set(r, idx, Page(0).With(Absent)|keep)
	c.setSlot(r, idx, 0)
}

func (c *client) removeRegion(r *region) {
	if r.px != nil {
		c.a.shm.leave(r)
	}
	for idx, p := range r.pages {
		if p.State() == Staged {
			c.ev.staged--
			if s := c.ev.stageOf(r, idx); s >= 0 {
				c.freeStage(s)
			}
		}
		c.set(r, idx, 0)
		if r.slots[idx] != 0 {
			c.st.pooled.Add(-1) // released all at once by freeRegions
		}
	}
	r.gone = true
	c.regs.remove(r)
	c.ev.clock.Reset()
	c.st.regions.Add(-1)
	c.a.freeRegions([]*region{r})
	c.cj.delRegion(r)
}

// remap follows a region moved whole by mremap. Moves of part of a region
// are not followed: the pages left behind are dropped (the shim announces
// such moves with REGION_DEL and REGION_ADD instead).
func (c *client) remap(from, to userfaultfd.Addr, length uint64) {
	for _, r := range c.regs.list {
		if r.start == from && uint64(len(r.pages))*pageSize == length {
			r.start = to
			c.regs.sort()
			return
		}
	}
	c.log.Warn("mremap of part of a region; its pages are dropped",
		zap.Stringer("from", from), zap.Stringer("to", to), zap.Uint64("len", length))
	c.dropRange(userfaultfd.Range{Start: from, Len: length}, true)
}

// serveSocket handles one packet from the client at now (the turn's
// time). It reports false when the client is gone (socket closed and no
// pidfd to tell).
func (c *client) serveSocket(now time.Time) bool {
	var fds [proto.MaxFDs]int
	pkt, nfds, err := c.sock.recv(fds[:])
	for _, fd := range fds[:nfds] {
		unix.Close(fd) // the client sends none after HELLO
	}
	if err != nil {
		switch {
		case errors.Is(err, io.EOF):
		case errors.Is(err, unix.ECONNRESET):
			// An exit with unread packets (an EVICT in flight): the
			// pidfd or the uffd tells the rest.
			c.log.Debug("client socket reset", zap.Error(err))
		default:
			c.log.Warn("client socket failed", zap.Error(err))
		}
		c.sock.drop()
		return c.sock.pidfd >= 0
	}
	h, body, err := proto.Parse(pkt)
	if err == nil {
		err = c.message(h, body, now)
	}
	if err != nil {
		c.log.Warn("bad message from client; closing its connection", zap.Error(err))
		c.sock.drop()
		return c.sock.pidfd >= 0
	}
	return true
}

func (c *client) message(h proto.Header, body []byte, now time.Time) error {
	switch h.Type {
	case proto.TypeRegionAdd:
		var m proto.RegionAdd
		if err := m.Decode(body); err != nil {
			return err
		}
		return c.sock.reply(h.Seq, c.addRegion(&m))
	case proto.TypeRegionDel:
		var m proto.RegionDel
		if err := m.Decode(body); err != nil {
			return err
		}
		return c.sock.reply(h.Seq, c.delRegion(&m))
	case proto.TypeRegionZap:
		var m proto.RegionZap
		if err := m.Decode(body); err != nil {
			return err
		}
		return c.sock.reply(h.Seq, c.zapRegion(&m))
	case proto.TypeEvicted:
		var m proto.Evicted
		if err := m.Decode(body); err != nil {
			return err
		}
		c.evicted(&m, now)
		return nil
	case proto.TypeForkPrepare:
		var m proto.ForkPrepare
		if err := m.Decode(body); err != nil {
			return err
		}
		wait, err := c.forkPrepare(h.Seq, &m, now)
		if wait {
			return nil // answered by forkSettled
		}
		return c.sock.reply(h.Seq, err)
	case proto.TypeForkDone:
		var m proto.ForkDone
		if err := m.Decode(body); err != nil {
			return err
		}
		c.forkDone(&m)
		return nil
	case proto.TypeHandoff:
		var m proto.Handoff
		if err := m.Decode(body); err != nil {
			return err
		}
		return c.sock.reply(h.Seq, c.handoff(&m))
	}
	return errors.Join(proto.ErrType, errors.New(h.Type.String()+" from a client"))
}

// Region limits.
const maxRegions = 1 << 16

func (c *client) addRegion(m *proto.RegionAdd) error {
	rng := m.Range
	end, ok := rng.End()
	if !ok || rng.Len == 0 || !rng.PageAligned(pageSize) {
		return errWithErrno(unix.EINVAL, "region is empty, unaligned or wraps")
	}
	var bad error
	switch {
	case m.Flags&proto.RegionUnpaged != 0:
	case c.regs.byID(m.ID) != nil:
		bad = errWithErrno(unix.EEXIST, "region id in use")
	case c.regs.overlaps(rng.Start, end):
		// (A region keeps its span when a piece of it is unmapped or
		// mapped over.)
		bad = errWithErrno(unix.EEXIST, "region overlaps another")
	case len(c.regs.list) >= maxRegions:
		bad = errWithErrno(unix.ENOSPC, "too many regions")
	}
	owner := m.Kind == proto.KindShared && c.a.shm.isOwner(c)
	if m.Kind == proto.KindShared && !owner {
		return c.addProxy(m, bad)
	}
	if bad != nil {
		return bad
	}
	n := int(rng.Len / pageSize)
	r := &region{id: m.ID, start: rng.Start, kind: m.Kind, pages: make(PageTable, n), slots: make([]Slot, n)}
	c.journalRegion(r)
	if c.a.opts.MaxPrefetch > 0 {
		r.pf = NewPrefetcher(32, c.a.opts.MaxPrefetch)
	}
	c.regs.add(r)
	c.ev.clock.Reset()
	c.st.regions.Add(1)
	if owner {
		c.a.shm.ownerRegion(c, r)
	}
	return nil
}

// regionPages returns region id and the pages [from, to) that rng covers
// in it, or the error to answer a request naming them with.
func (c *client) regionPages(id uint64, rng userfaultfd.Range) (r *region, from, to int, err error) {
	r = c.regs.byID(id)
	if r == nil {
		return nil, 0, 0, errWithErrno(unix.ENOENT, "no such region")
	}
	end, ok := rng.End()
	if !ok || rng.Start < r.start || end > r.end() || !rng.PageAligned(pageSize) {
		return nil, 0, 0, errWithErrno(unix.EINVAL, "range is not page aligned inside the region")
	}
	from = int(uint64(rng.Start-r.start) / pageSize)
	return r, from, from + int(rng.Len/pageSize), nil
}

func (c *client) delRegion(m *proto.RegionDel) error {
	if _, _, _, err := c.regionPages(m.ID, m.Range); err != nil {
		return err
	}
	c.dropRange(m.Range, true)
	return nil
}

// zapRegion forgets the pages of a range the program is dropping
// (MADV_DONTNEED): they read as zeros from now on. A page being evicted
// becomes Absent too, still busy: evicted sees that and keeps it Absent.
func (c *client) zapRegion(m *proto.RegionZap) error {
	r, from, to, err := c.regionPages(m.ID, m.Range)
	if err != nil {
		return err
	}
	if r.px != nil {
		// MADV_REMOVE of shared memory: the process punches the pages
		// out of the file itself; the segment forgets its copies.
		c.a.shm.zap(r, m.Range)
		return nil
	}
	for idx := from; idx < to; idx++ {
		if r.pages[idx].State() != Absent {
			c.dropPage(r, idx)
		}
	}
	return nil
}
