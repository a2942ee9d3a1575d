package pager

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	rmemclient "rmem/client"
	"rmem/pager/proto"
	"rmem/procinfo"
	"rmem/userfaultfd"
)

// Shared memory (docs/pager.md, "Shared memory"). A MAP_SHARED mapping of
// a shmem file (tmpfs, memfd, MAP_SHARED|MAP_ANONYMOUS) that a client
// announces (proto.KindShared) is not paged as its own memory: its pages
// live in the file, one copy for every process that maps it. The agent
// pages the file, a segment, once:
//
//   - The agent maps the whole segment itself, through a client of its own
//     (the owner, rmem/client's MapShared in this process), as a region of
//     kind shared: the owner's loop pages it as any region (budget,
//     CLOCK, prefetch, pool, statistics), with two differences: every
//     page is written back when evicted (writes come through the other
//     mappings, which the owner's page table does not see), and evicting a
//     page punches it out of the file (MADV_REMOVE), so that it leaves
//     tmpfs and is a hole in every mapping.
//   - Each process's mapping is a proxy region of its client: no page
//     table, registered MISSING|WP with the process's uffd. A MISSING
//     fault there (a hole) is posted to the owner's loop (holes), which
//     serves it as a fault of the same page of its own mapping (a READ,
//     the zero page, held while the page is being evicted or past the
//     budget), which puts the page into the file; the process's thread is
//     then woken (wakeHoles) and finds it in the page cache. A page in the
//     file never faults. The agent never touches the mapping itself
//     (DESIGN.md pitfall 1): its pages come in with UFFDIO_COPY.
//   - An eviction write-protects its victims in every proxy as well as in
//     the owner (protectShared) before the copy, and lifts that once the
//     pages are punched (unprotectShared): a write meanwhile waits in the
//     writer's uffd, then faults the page back from the pool.
//
// A page is counted once, in the owner's budget, the agent's (--local-mem
// of memagent run), whichever process touches it.
//
// Not handled (docs/pager.md): a process that maps the segment without
// the shim reads a page evicted as a hole (zeros); a segment that holds
// pages before its first mapping under the agent is not paged; a proxy is
// not resumed by a next agent (its holes raise SIGBUS).

// segKey names a shmem file.
type segKey struct{ dev, ino uint64 }

// segment is a shmem file the agent pages: the owner's mapping of it and
// the proxies that map it. mappers and wp are guarded by sharedTable.mu.
type segment struct {
	key  segKey
	file *os.File
	mem  []byte // the owner's mapping: a region of the owner client
	anon bool   // MAP_SHARED|MAP_ANONYMOUS: no name, reachable only through its mappings

	mappers []*region // the proxies that map it, each of its client (region.proxy)
	wp      []uint64  // pages write-protected in the proxies by an eviction in flight (bitmap)
	reg     *region   // the owner's region: its loop's (set by ownerRegion)
	unpage  bool      // on unpaging
}

func (s *segment) size() uint64 { return uint64(len(s.mem)) }

// proxy is what a proxy region (a process's mapping of a segment) has
// instead of a page table.
type proxy struct {
	seg *segment // nil: lost (resumed without its segment): its holes raise SIGBUS
	off uint64   // the segment offset its start maps
	c   *client
	// live are the parts still mapped (a REGION_DEL may cut one out of
	// the middle), sorted, in addresses.
	live []userfaultfd.Range
}

// sharedTable is the agent's segments and its owner client.
type sharedTable struct {
	a      *Agent
	create sync.Mutex // one segment made at a time (before mu)
	mu     sync.Mutex
	owner  *rmemclient.Client
	// ownerID is the owner's client id, set before its first REGION_ADD.
	ownerID atomic.Uint64
	ownerC  *client // the owner's loop's client, once it has a region
	segs    map[segKey]*segment
	byReg   map[uint64]*segment // by the owner's region id
	// ownerRegs: the owner's regions (ownerRegion) not linked yet, by
	// address.
	ownerRegs map[userfaultfd.Addr]*region
	holes     []holeFault // posted by proxies, for the owner's loop
	// unpaging: named segments no process maps any more, for the owner's
	// loop to write back into their files (unpageSegments).
	unpaging []*segment
	wg       sync.WaitGroup // dropping segments
	closed   bool           // guarded by mu
}

// holeFault is a hole a proxy faulted on, served by the owner's loop, or
// with zap set, pages [off, off+zap) of the segment a proxy's process
// punches (MADV_REMOVE): the owner forgets them, in the order posted.
type holeFault struct {
	r     *region // the proxy
	a     userfaultfd.Addr
	seg   *segment
	off   uint64
	zap   uint64
	flags userfaultfd.FaultFlags
	since time.Time
}

func newSharedTable(a *Agent) *sharedTable {
	return &sharedTable{a: a, segs: map[segKey]*segment{}, byReg: map[uint64]*segment{}, ownerRegs: map[userfaultfd.Addr]*region{}}
}

// start connects the owner, the first time a segment is made.
// Preconditions: t.create held.
func (t *sharedTable) start() error {
	if t.owner != nil {
		return nil
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("agent closing")
	}
	o, err := rmemclient.Connect(t.a.opts.Socket)
	if err != nil {
		return fmt.Errorf("the agent's own client for shared memory: %w", err)
	}
	t.owner = o
	t.ownerID.Store(o.ID())
	return nil
}

// close ends the owner client (the segments' pages in the files stay
// there; those in the pool go with it).
func (t *sharedTable) close() {
	// Segments being brought back into their files first, and those
	// whose mappers have exited without their loops having seen it yet
	// (memagent run closes the agent as soon as its program exits): the
	// owner's loop is still running.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && t.settling(); {
		time.Sleep(10 * time.Millisecond)
	}
	t.create.Lock()
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	o := t.owner
	t.create.Unlock()
	t.wg.Wait()
	if o == nil {
		return
	}
	o.Close()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.segs {
		s.file.Close()
	}
}

// settling reports whether a segment is being written back into its
// file, or is mapped by a process that has exited (its loop will take it
// out, and so may have it written back).
func (t *sharedTable) settling() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.unpaging) > 0 {
		return true
	}
	for _, s := range t.segs {
		for _, m := range s.mappers {
			if pid := int(m.px.c.pidAtm.Load()); pid > 0 && procinfo.Exited(pid) {
				return true
			}
		}
	}
	return false
}

// isOwner reports whether c is the agent's own client (its loop asks,
// while open waits for its answer: no lock).
func (t *sharedTable) isOwner(c *client) bool { return t.ownerID.Load() == c.id }

// open finds or makes the segment that [start, start+len) of process pid
// maps, and returns it with the file offset of start. Errors refuse the
// region (it stays ordinary memory).
func (t *sharedTable) open(pid int, rng userfaultfd.Range) (*segment, uint64, error) {
	end, _ := rng.End()
	m, err := procinfo.MappingAt(pid, uint64(rng.Start))
	if err != nil {
		return nil, 0, err
	}
	if m.End != uint64(end) {
		return nil, 0, fmt.Errorf("the mapping at %v ends at %#x, not %v", rng.Start, m.End, end)
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, uint64(rng.Start), uint64(end)), os.O_RDWR, 0)
	if err != nil {
		return nil, 0, err
	}
	var st unix.Stat_t
	var fs unix.Statfs_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, 0, err
	}
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		f.Close()
		return nil, 0, fmt.Errorf("not shared memory (file system %#x)", fs.Type)
	}
	key := segKey{st.Dev, st.Ino}
	t.create.Lock()
	defer t.create.Unlock()
	t.mu.Lock()
	s := t.segs[key]
	t.mu.Unlock()
	if s != nil {
		f.Close()
		return s, m.Offset, nil
	}
	size := (uint64(st.Size) + pageSize - 1) &^ (pageSize - 1)
	switch {
	case st.Blocks != 0:
		f.Close()
		return nil, 0, errors.New("the segment holds pages already: not paged")
	case size == 0:
		f.Close()
		return nil, 0, errors.New("the segment is empty")
	}
	if err := t.start(); err != nil {
		f.Close()
		return nil, 0, err
	}
	mem, err := t.owner.MapShared(f, int(size))
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	s = &segment{key: key, file: f, mem: mem, anon: st.Nlink == 0 && m.Anon,
		wp: make([]uint64, (size/pageSize+63)/64)}
	t.mu.Lock()
	err = t.link(s)
	if err == nil {
		t.segs[key] = s
	}
	t.mu.Unlock()
	if err != nil {
		t.owner.Unmap(mem)
		f.Close()
		return nil, 0, err
	}
	return s, m.Offset, nil
}

// ownerRegion ties the owner's region r (added by MapShared) to its
// segment, by address. Called by the owner's loop, c.
func (t *sharedTable) ownerRegion(c *client, r *region) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ownerC = c
	t.ownerRegs[r.start] = r // open links it once MapShared returns
}

// link ties segment s to the owner's region of its mapping.
// Preconditions: t.mu held.
func (t *sharedTable) link(s *segment) error {
	base := userfaultfd.AddrOf(s.mem)
	r := t.ownerRegs[base]
	if r == nil {
		return errors.New("the owner's region is not known")
	}
	delete(t.ownerRegs, base)
	s.reg = r
	t.byReg[r.id] = s
	return nil
}

// join makes proxy region r a mapper of its segment.
func (t *sharedTable) join(r *region) {
	if r.px.seg == nil {
		return
	}
	t.mu.Lock()
	r.px.seg.mappers = append(r.px.seg.mappers, r)
	t.mu.Unlock()
}

// leave takes proxy region r out of its segment: its client's uffd is no
// longer used for it. When the last mapping goes, so does the segment: an
// anonymous one is dropped (no one can reach its pages any more); a named
// one (/dev/shm, memfd) is unpaged first, its pages in the pool written
// back into the file (unpageSegments), since a process may map or read it
// later.
func (t *sharedTable) leave(r *region) {
	s := r.px.seg
	if s == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.Index(s.mappers, r)
	if i < 0 {
		return // left already
	}
	s.mappers = slices.Delete(s.mappers, i, i+1)
	switch {
	case len(s.mappers) > 0 || t.closed || s.unpage:
	case s.anon:
		t.dropLocked(s)
	default:
		s.unpage = true
		t.unpaging = append(t.unpaging, s)
		if t.ownerC != nil {
			t.ownerC.wake()
		}
	}
}

// dropLocked forgets segment s and has the owner unmap it, off the
// caller's loop (the owner's loop answers the REGION_DEL, and may be the
// caller). Preconditions: t.mu held, not closed.
func (t *sharedTable) dropLocked(s *segment) {
	delete(t.segs, s.key)
	delete(t.byReg, s.reg.id)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if err := t.owner.Unmap(s.mem); err != nil && !errors.Is(err, rmemclient.ErrClosed) {
			t.a.log.Warn("dropping a shared memory segment", zap.Error(err))
		}
		s.file.Close()
	}()
}

// doneUnpaging takes s off the list, and with drop, drops it unless a
// process maps it again. Called by the owner's loop.
func (t *sharedTable) doneUnpaging(s *segment, drop bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.unpaging, s); i >= 0 {
		t.unpaging = slices.Delete(t.unpaging, i, i+1)
	}
	s.unpage = false
	switch {
	case len(s.mappers) > 0:
		// Mapped again: paged on (its pages in the file as well as in
		// the pool, which an install finds there: EEXIST).
		if s.reg != nil {
			s.reg.pinned = false
		}
	case drop && !t.closed:
		t.dropLocked(s)
	}
}

// cut takes rng out of proxy region r's live parts, under mu (an
// eviction reads them), and reports whether anything is left.
func (t *sharedTable) cut(r *region, rng userfaultfd.Range) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.px.cut(rng)
}

// cut takes rng out of proxy r's live parts (a REGION_DEL or UNMAP of a
// piece); it reports whether anything is left.
func (px *proxy) cut(rng userfaultfd.Range) bool {
	end, _ := rng.End()
	var live []userfaultfd.Range
	for _, l := range px.live {
		le, _ := l.End()
		if le <= rng.Start || end <= l.Start {
			live = append(live, l)
			continue
		}
		if l.Start < rng.Start {
			live = append(live, userfaultfd.Range{Start: l.Start, Len: uint64(rng.Start - l.Start)})
		}
		if end < le {
			live = append(live, userfaultfd.Range{Start: end, Len: uint64(le - end)})
		}
	}
	px.live = live
	return len(live) > 0
}

// fault serves a fault of proxy region r's client at a, raised at since:
// a hole (MISSING) is posted for the owner's loop; a WP fault is an eviction's protection, lifted
// by the eviction when it is done, or left from one (lifted here).
func (t *sharedTable) fault(r *region, a userfaultfd.Addr, flags userfaultfd.FaultFlags, since time.Time) {
	c, px := r.px.c, r.px
	if px.seg == nil {
		c.poisonAt(a)
		return
	}
	off := px.off + uint64(a-r.start)
	if flags&userfaultfd.FaultWP != 0 {
		t.mu.Lock()
		busy := off < px.seg.size() && px.seg.wp[off/pageSize/64]&(1<<(off/pageSize%64)) != 0
		t.mu.Unlock()
		if !busy {
			if err := c.uffd.Unprotect(pageRange(a), 0); err != nil {
				c.uffd.Wake(pageRange(a))
			}
		}
		return
	}
	if off >= px.seg.size() {
		// Past the end the segment had when first mapped (it grew):
		// never paged, so a hole there is one.
		if _, err := c.uffd.ZeroPage(pageRange(a), 0); err != nil {
			c.uffd.Wake(pageRange(a))
		}
		return
	}
	t.mu.Lock()
	o := t.ownerC
	if o != nil {
		t.holes = append(t.holes, holeFault{r: r, a: a, seg: px.seg, off: off, flags: flags & userfaultfd.FaultWrite, since: since})
	}
	t.mu.Unlock()
	if o == nil {
		c.uffd.Wake(pageRange(a)) // faults again
		return
	}
	o.wake()
}

// zap posts pages of proxy r's range rng, which its process is punching
// out of the segment (MADV_REMOVE), for the owner's loop to forget: they
// read as zeros from now on, not as the pool's copies. The process
// punches them once this returns; its later holes there come after the
// zap, in the owner's order.
func (t *sharedTable) zap(r *region, rng userfaultfd.Range) {
	px := r.px
	if px.seg == nil {
		return
	}
	off := px.off + uint64(rng.Start-r.start)
	t.mu.Lock()
	o := t.ownerC
	if o != nil {
		t.holes = append(t.holes, holeFault{r: r, seg: px.seg, off: off, zap: rng.Len})
	}
	t.mu.Unlock()
	if o != nil {
		o.wake()
	}
}

// protectShared write-protects pages [lo, lo+n) of the owner's region r
// in every proxy that maps them, and marks them so. A proxy whose uffd
// refuses (its address space is changing) fails it: what was protected
// is lifted again, and the pages are not evicted this time.
func (t *sharedTable) protectShared(r *region, lo, n int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byReg[r.id]
	if s == nil {
		return nil
	}
	for q := lo; q < lo+n; q++ {
		s.wp[q/64] |= 1 << (q % 64)
	}
	for i, m := range s.mappers {
		if err := t.each(m, lo, n, func(u faultFD, rg userfaultfd.Range) error { return u.WriteProtect(rg) }); err != nil {
			for _, m := range s.mappers[:i+1] {
				t.each(m, lo, n, func(u faultFD, rg userfaultfd.Range) error { return unprotectOrWake(u, rg) })
			}
			for q := lo; q < lo+n; q++ {
				s.wp[q/64] &^= 1 << (q % 64)
			}
			return err
		}
	}
	return nil
}

// unprotectShared lifts protectShared, waking the writers that waited.
func (t *sharedTable) unprotectShared(r *region, lo, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byReg[r.id]
	if s == nil {
		return
	}
	for q := lo; q < lo+n; q++ {
		s.wp[q/64] &^= 1 << (q % 64)
	}
	for _, m := range s.mappers {
		t.each(m, lo, n, func(u faultFD, rg userfaultfd.Range) error { return unprotectOrWake(u, rg) })
	}
}

func unprotectOrWake(u faultFD, rg userfaultfd.Range) error {
	if err := u.Unprotect(rg, 0); err != nil {
		u.Wake(rg) // it faults again: its loop lifts the protection
	}
	return nil
}

// each calls f with proxy m's uffd and each live part of m that maps
// segment pages [lo, lo+n). An error of a process going away is none.
// Preconditions: t.mu held.
func (t *sharedTable) each(m *region, lo, n int, f func(faultFD, userfaultfd.Range) error) error {
	from, to := uint64(lo)*pageSize, uint64(lo+n)*pageSize
	mEnd := m.px.off + m.len()
	if to <= m.px.off || mEnd <= from {
		return nil
	}
	a := m.start + userfaultfd.Addr(max(from, m.px.off)-m.px.off)
	b := m.start + userfaultfd.Addr(min(to, mEnd)-m.px.off)
	for _, l := range m.px.live {
		le, _ := l.End()
		x, y := max(a, l.Start), min(b, le)
		if x >= y {
			continue
		}
		err := f(m.px.c.uffd.faultFD, userfaultfd.Range{Start: x, Len: uint64(y - x)})
		if err != nil && !userfaultfd.IsGone(err) {
			return err
		}
	}
	return nil
}

// addProxy makes m, a KindShared REGION_ADD of c (not the owner), a proxy
// of its segment. (A resumed one is rebuilt lost: resume.go.)
func (c *client) addProxy(m *proto.RegionAdd) error {
	rng := m.Range
	seg, off, err := c.a.shm.open(int(c.pidAtm.Load()), rng)
	if err != nil {
		c.log.Info("shared memory not paged", zap.Stringer("range", rng), zap.Error(err))
		return errWithErrno(unix.EINVAL, "shared memory not paged: "+err.Error())
	}
	r := &region{id: m.ID, start: rng.Start, kind: m.Kind, plen: rng.Len,
		px: &proxy{seg: seg, off: off, c: c, live: []userfaultfd.Range{rng}}}
	c.regs.add(r)
	c.a.shm.join(r)
	c.st.regions.Add(1)
	return nil
}

// poisonAt makes the page at a of c raise SIGBUS (a proxy's page lost).
func (c *client) poisonAt(a userfaultfd.Addr) {
	c.st.lost.Add(1)
	c.log.Error("PAGE LOST: a shared memory page is not in the pool; the client gets SIGBUS", zap.Stringer("addr", a))
	if c.features.Has(userfaultfd.FeaturePoison) {
		if _, err := c.uffd.Poison(pageRange(a), 0); err == nil || userfaultfd.IsExist(err) {
			return
		}
	}
	if pid := int(c.pidAtm.Load()); pid > 0 {
		unix.Kill(pid, unix.SIGBUS)
	}
}
