package pager

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
	"rmem/userfaultfd"
)

// Resuming the clients of a previous agent (docs/pager.md, Agent restart).
// The agent that starts with a StateDir its predecessor left loads the
// journal (journal.go) before it takes any slot: the slab of each slot
// number, and each client whose process still runs, as an orphan whose
// slots it holds. The process's shim, which lost its agent, connects again
// with a resuming HELLO (its uffd and staging memfd), re-announces its
// regions and says RESUME_DONE; the agent rebuilds the page tables from the
// journal and the process's pagemap, and serves it. An orphan that does not
// come back within ResumeWait is dropped, its slots released.

// DefaultResumeWait is Options.ResumeWait's default.
const DefaultResumeWait = time.Minute

// slabLister is a Store that can say which slabs it holds (the lease's, on
// a restart).
type slabLister interface {
	Slabs() []remote.SlabID
}

// loadJournal opens opts.StateDir and takes back what a previous agent
// left: its slabs (those the Store still holds) and the orphans.
func (a *Agent) loadJournal() error {
	j, err := openJournal(a.opts.StateDir)
	if err != nil {
		return err
	}
	a.journal = j
	a.slots.journal = j
	nums, err := j.loadSlabs()
	if err != nil {
		return err
	}
	if sl, ok := a.opts.Store.(slabLister); ok {
		held := map[remote.SlabID]bool{}
		for _, id := range sl.Slabs() {
			held[id] = true
		}
		known := map[remote.SlabID]bool{}
		for num, id := range nums {
			if !held[id] {
				delete(nums, num) // freed, or its lease is gone
				continue
			}
			known[id] = true
		}
		for id := range held {
			if !known[id] {
				a.leaked = append(a.leaked, id) // allocated, never recorded: freed below
			}
		}
	}
	if err := j.rewriteSlabs(nums); err != nil {
		return err
	}
	a.slots.restore(nums)
	for _, id := range j.listClients() {
		a.nextID.Store(max(a.nextID.Load(), id))
		dir := j.clientDir(id)
		o, err := loadOrphan(dir, id)
		if err != nil {
			a.log.Warn("a previous agent's journal of a client cannot be read; its pages are lost to it", zap.String("dir", dir), zap.Error(err))
			os.RemoveAll(dir)
			continue
		}
		if start, err := procStart(o.meta.PID); err != nil || start != o.meta.Start {
			o.cj.remove() // that process is gone
			continue
		}
		lost := 0
		for _, r := range o.regions {
			for idx, s := range r.slots {
				if s != 0 && !a.slots.claim(s) {
					r.slots[idx] = 0 // its slab is gone: the page is lost
					r.pages[idx] = Page(0).With(Lost)
					lost++
				}
			}
		}
		if lost > 0 {
			a.log.Error("PAGES LOST: a previous agent's slabs are gone (its lease expired?); the program gets SIGBUS on them",
				zap.Int("pid", o.meta.PID), zap.Int("pages", lost))
		}
		a.orphans[o.meta.PID] = o
		a.log.Info("a previous agent's client waits to resume", zap.Int("pid", o.meta.PID), zap.Int("regions", len(o.regions)))
	}
	if n := len(a.orphans); n > 0 {
		a.resumeBy = a.opts.Now().Add(a.opts.ResumeWait)
		time.AfterFunc(a.opts.ResumeWait, func() { a.dropOrphans(a.opts.Now()) })
	}
	return nil
}

// freeLeaked gives back slabs the lease holds that no journal names.
func (a *Agent) freeLeaked() {
	if len(a.leaked) > 0 {
		a.slots.freeSlabs(a.ctx, a.leaked)
		a.leaked = nil
	}
}

// dropOrphans releases the orphans that did not resume in time, if now
// is past ResumeWait.
func (a *Agent) dropOrphans(now time.Time) {
	a.mu.Lock()
	if a.closed || now.Before(a.resumeBy) {
		a.mu.Unlock()
		return
	}
	var gone []*orphan
	for pid, o := range a.orphans {
		gone = append(gone, o)
		delete(a.orphans, pid)
	}
	a.mu.Unlock()
	for _, o := range gone {
		a.log.Warn("a previous agent's client did not come back; its pages in the pool are dropped", zap.Int("pid", o.meta.PID))
		a.freeRegions(o.regions)
		o.cj.remove()
	}
}

// takeOrphan hands the orphan of process pid to it, if its user matches.
func (a *Agent) takeOrphan(pid int, uid uint32) *orphan {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.orphans[pid]
	if o == nil || o.meta.UID != uid {
		return nil
	}
	delete(a.orphans, pid)
	return o
}

// resumeTimeout bounds the re-announcement of a resuming process's regions.
const resumeTimeout = 10 * time.Second

// resume serves a resuming HELLO: fds are the process's uffd and staging
// memfd. It answers WELCOME, reads the re-announced regions until
// RESUME_DONE, rebuilds the page tables and starts the client's loop.
func (a *Agent) resume(conn *net.UnixConn, cred *unix.Ucred, h proto.Header, hello *proto.Hello, fds []int, buf, oob []byte,
	refuse func(proto.Header, unix.Errno, string)) bool {
	if len(fds) != 2 {
		closeAll(fds)
		refuse(h, unix.EINVAL, "a resuming HELLO carries the uffd and the staging memfd")
		return false
	}
	o := a.takeOrphan(int(cred.Pid), cred.Uid)
	slots, id := a.opts.StagingSlots, uint64(0)
	if o != nil {
		slots, id = o.meta.Staging, o.id
	}
	size := int64(slots) * pageSize
	if hello.Flags&proto.HelloRing != 0 {
		size += proto.RingSize
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds[1], &st); err != nil || st.Size < size {
		closeAll(fds)
		a.dropOrphan(o)
		refuse(h, unix.EINVAL, "the staging memfd is missing or too small")
		return false
	}
	u, err := userfaultfd.FromFD(fds[0], hello.Features)
	if err != nil {
		closeAll(fds)
		a.dropOrphan(o)
		refuse(h, unix.EBADF, "not a userfaultfd: "+err.Error())
		return false
	}
	c, err := a.newClientWith(u, hello.Features, fds[1], slots, id)
	if err != nil {
		u.Close()
		a.dropOrphan(o)
		refuse(h, unix.ENOMEM, err.Error())
		return false
	}
	c.bud.localMem.Store(hello.LocalMem)
	c.bud.maxSlowdown.Store(hello.MaxSlowdown)
	c.uid.Store(cred.Uid)
	c.hello.Store(uint32(hello.Flags))
	c.pidAtm.Store(int64(cred.Pid))
	welcome := proto.Welcome{ClientID: c.id, MinAlloc: a.opts.MinAlloc, StagingSlots: uint32(slots)}
	if o != nil {
		welcome.Flags = proto.WelcomeResumed
		c.fk.forks = o.meta.Forks
		if hello.LocalMem == 0 {
			c.bud.localMem.Store(o.meta.LocalMem)
		}
	}
	if err := proto.Send(conn, buf, 1, &welcome, c.welcomeFDs(&welcome)...); err != nil {
		c.teardownUnstarted()
		a.dropOrphan(o)
		return false
	}
	conn.SetDeadline(time.Now().Add(resumeTimeout))
	var adds []proto.RegionAdd
	var done proto.ResumeDone
	var fdbuf [proto.MaxFDs]int
	for {
		pkt, nfds, err := proto.Recv(conn, buf, oob, fdbuf[:])
		for _, fd := range fdbuf[:nfds] {
			unix.Close(fd)
		}
		if err != nil {
			a.log.Warn("a resuming client did not finish re-announcing its regions", zap.Int32("pid", cred.Pid), zap.Error(err))
			c.teardownUnstarted()
			a.dropOrphan(o)
			return false
		}
		var m proto.RegionAdd
		if ph, err := proto.Expect(pkt, &m); err == nil && m.Flags&proto.RegionResumed != 0 && len(adds) < maxRegions {
			adds = append(adds, m)
			continue
		} else if _, derr := proto.Expect(pkt, &done); derr == nil {
			h = ph
			break
		}
		refuse(h, unix.EPROTO, "a resuming client sends REGION_ADDs (resumed) and RESUME_DONE")
		c.teardownUnstarted()
		a.dropOrphan(o)
		return false
	}
	if int(done.Regions) != len(adds) {
		a.log.Warn("RESUME_DONE counts other regions than were re-announced", zap.Uint32("said", done.Regions), zap.Int("got", len(adds)))
	}
	if err := c.rebuild(o, adds); err != nil {
		refuse(h, unix.EIO, "rebuilding the page tables: "+err.Error())
		c.teardownUnstarted()
		return false
	}
	c.startJournal(int(cred.Pid), cred.Uid) // a process the journal did not know
	c.wakeAll()
	if err := proto.Send(conn, buf, 2, &proto.Ack{Seq: h.Seq}); err != nil || !a.start(c) {
		return false
	}
	conn.SetDeadline(time.Time{})
	a.log.Info("client resumed", zap.Uint64("client", c.id), zap.Int32("pid", cred.Pid), zap.Bool("journal", o != nil),
		zap.Int("regions", len(adds)), zap.Int64("resident", c.st.resident.Load()), zap.Int64("remote", c.st.remote.Load()))
	c.attach(conn, int(cred.Pid))
	return true
}

// wakeAll wakes every thread of the process that waits on a fault in its
// regions. A fault the previous agent read from the uffd but never
// answered is not delivered again: its thread would sleep in the kernel
// for good (check 11 hung 1 run in 3 when the agent was killed while the
// program faulted). Woken, each thread retries its access and faults again,
// to this agent; a wake where no thread waits does nothing.
func (c *client) wakeAll() {
	for _, r := range c.regs.list {
		if err := c.uffd.Wake(userfaultfd.Range{Start: r.start, Len: r.len()}); err != nil {
			c.log.Warn("waking a resumed process's faults", zap.Uint64("region", r.id), zap.Error(err))
		}
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// dropOrphan releases what orphan o holds (nil: nothing).
func (a *Agent) dropOrphan(o *orphan) {
	if o != nil {
		a.freeRegions(o.regions)
		o.cj.remove()
	}
}

// errNoPagemap: the process's pagemap cannot be read.
var errNoPagemap = errors.New("pager: no pagemap")

// pagemap bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmUffdWP  = 1 << 57
)

// rebuild makes c's regions from the re-announced ones (adds) and orphan
// o's journal (nil: none). A page is resident if the process maps it,
// clean if it is write-protected and its pool slot recorded; else in the
// pool if its slot is; else staged if a staging slot holds it; else never
// written. A region the journal does not know (or with no journal) knows
// nothing of the pages it lacks: they are Lost (SIGBUS, never zeros).
func (c *client) rebuild(o *orphan, adds []proto.RegionAdd) error {
	pm, err := os.Open("/proc/" + strconv.Itoa(int(c.pidAtm.Load())) + "/pagemap")
	if err != nil {
		return fmt.Errorf("%w: %v", errNoPagemap, err)
	}
	defer pm.Close()
	known := map[uint64]*region{}
	staged := map[pageRef]int{}
	if o != nil {
		for _, r := range o.regions {
			known[r.id] = r
		}
		for s, ref := range o.staged {
			staged[ref] = s
		}
		c.cj = o.cj
	}
	used := map[uint64]bool{}
	buf := make([]byte, 8*4096)
	for _, m := range adds {
		if m.Kind == proto.KindShared {
			// Shared memory: its segment went with the last agent. Its
			// pages in the file stay; its holes raise SIGBUS (shared.go).
			c.log.Warn("a shared memory mapping resumed without its segment: its pages that were in the pool are lost (SIGBUS)", zap.Stringer("start", m.Range.Start))
			c.addProxyRegion(&m, nil, 0)
			used[m.ID] = true
			continue
		}
		n := int(m.Range.Len / pageSize)
		r := known[m.ID]
		if r == nil || r.start != m.Range.Start || len(r.pages) != n || used[m.ID] {
			r = &region{id: m.ID, start: m.Range.Start, kind: m.Kind, pages: make(PageTable, n), slots: make([]Slot, n)}
			for i := range r.pages {
				r.pages[i] = Page(0).With(Lost) // unless resident
			}
			if o != nil {
				c.log.Warn("a re-announced region is not in the journal; its pages that are not resident are lost",
					zap.Uint64("region", m.ID), zap.Stringer("start", m.Range.Start))
			}
		}
		used[m.ID] = true
		r.kind = m.Kind
		if c.a.opts.MaxPrefetch > 0 {
			r.pf = NewPrefetcher(32, c.a.opts.MaxPrefetch)
		}
		for idx := 0; idx < n; idx += len(buf) / 8 {
			k := min(len(buf)/8, n-idx)
			off := int64(uint64(r.start)/pageSize+uint64(idx)) * 8
			if _, err := pm.ReadAt(buf[:k*8], off); err != nil {
				return fmt.Errorf("%w: %v", errNoPagemap, err)
			}
			for i := 0; i < k; i++ {
				c.place(r, idx+i, binary.LittleEndian.Uint64(buf[i*8:]), staged)
			}
		}
		c.regs.add(r)
		c.st.regions.Add(1)
		if known[m.ID] != r {
			c.journalRegion(r)
		}
	}
	for id, r := range known { // regions the process no longer has
		if !used[id] {
			c.a.freeRegions([]*region{r})
			c.cj.delRegion(r)
		}
	}
	return nil
}

// place sets page idx of r from its pagemap entry pm, its journaled slot
// and staging slot (staged), and counts it.
func (c *client) place(r *region, idx int, pm uint64, staged map[pageRef]int) {
	ref := pageRef{r, idx}
	s, isStaged := staged[ref]
	slot := r.slots[idx]
	var p Page
	switch {
	case pm&pmPresent != 0 && (isStaged || slot == 0 || pm&pmUffdWP == 0):
		// Resident and written (or being evicted dirty: the slot its
		// write-back took was never written): dirty.
		p = Page(0).With(Resident) | FlagDirty | FlagRef
		if slot != 0 {
			c.a.slots.release(slot)
			r.slots[idx], slot = 0, 0
		}
	case pm&pmPresent != 0:
		p = Page(0).With(Resident) | FlagRef // clean: the pool has it
	case isStaged && slot != 0:
		p = Page(0).With(Staged)
		c.ev.stageOwner[s] = ref
		c.ev.stageFree = removeStage(c.ev.stageFree, uint32(s))
		c.ev.staged++
	case slot != 0:
		p = Page(0).With(Remote)
	case r.pages[idx].State() == Lost:
		p = r.pages[idx]
	default:
		p = Page(0).With(Absent)
	}
	r.pages[idx] = 0
	c.set(r, idx, p)
	if slot != 0 {
		c.st.pooled.Add(1)
	}
}

func removeStage(free []uint32, s uint32) []uint32 {
	for i, f := range free {
		if f == s {
			return append(free[:i], free[i+1:]...)
		}
	}
	return free
}
