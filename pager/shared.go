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
	"rmem/fsguard"
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
// A segment is paged only while every mapping of it is a proxy: one that
// is not would read an evicted page as a hole. Anything else that reaches
// it (a process outside the agent that opens it, held by the guard; a
// read(2); a mapping the shim cannot register or the agent cannot make a
// proxy) releases it first (release): its pages are written back into the
// file, and it is paged no more.
//
// Descriptors that leave the agent's sight without an open (kept across
// exec, passed over a socket) release the segments they reach first: the
// shim says so (handoff). Not handled (docs/pager.md): those that leave
// through raw system calls, read(2) through a descriptor opened before
// the segment was paged, and write(2); a segment that holds pages before
// its first mapping under the agent is not paged; a proxy is not resumed
// by a next agent (its holes raise SIGBUS).

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
	wp      pageBits  // pages write-protected in the proxies by an eviction in flight
	reg     *region   // the owner's region: its loop's (set by ownerRegion)
	unpage  bool      // on unpaging
	// released is made when the segment is released (release): brought
	// back into its file and paged no more, while processes still map
	// it; closed once it is. gone is set then.
	released chan struct{}
	gone     bool
	// lost marks the pages that could not be brought back into the file
	// (the pool lost them; a bitmap, nil for none): holes there raise
	// SIGBUS in its mappings, and the segment stays watched, kept after
	// its last mapping goes: a process outside the agent may not open it
	// and no one may read(2) it (EPERM), where it would read zeros.
	lost pageBits
}

// pageBits is a set of a segment's pages, by index.
type pageBits []uint64

func newPageBits(pages uint64) pageBits { return make(pageBits, (pages+63)/64) }

// has reports whether page q is in the set (false past its end).
func (b pageBits) has(q uint64) bool { return q/64 < uint64(len(b)) && b[q/64]&(1<<(q%64)) != 0 }

// set adds pages [lo, lo+n) (on) or takes them out.
func (b pageBits) set(lo, n uint64, on bool) {
	for q := lo; q < lo+n && q/64 < uint64(len(b)); q++ {
		if on {
			b[q/64] |= 1 << (q % 64)
		} else {
			b[q/64] &^= 1 << (q % 64)
		}
	}
}

// runs calls f with each run of adjacent pages in the set, in order.
func (b pageBits) runs(f func(lo, n uint64)) {
	end := uint64(len(b)) * 64
	for q := uint64(0); q < end; {
		switch {
		case b[q/64] == 0:
			q = (q/64 + 1) * 64
		case !b.has(q):
			q++
		default:
			n := uint64(1)
			for b.has(q + n) {
				n++
			}
			f(q, n)
			q += n
		}
	}
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
	// guard holds the opens of the segments' files by processes that
	// would not map them through the shim (opened), made with the first
	// segment (under create; nil with guardErr when it cannot be).
	guard    *fsguard.Guard
	guardErr error
	releases uint64 // segments released (guarded by mu)
}

// holeFault is a hole a proxy faulted on, served by the owner's loop, or
// with zap set, pages [off, off+zap) of the segment a proxy's process
// punches (MADV_REMOVE): the owner forgets them, in the order posted, and
// closes done once the holes of that turn are served.
type holeFault struct {
	r     *region // the proxy
	a     userfaultfd.Addr
	seg   *segment
	off   uint64
	zap   uint64
	done  chan struct{} // with zap
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
	g := t.guard
	t.create.Unlock()
	if g != nil {
		g.Close() // its decisions waiting for releases get them: the owner's loop is running
	}
	t.create.Lock()
	t.mu.Lock()
	t.closed = true
	for i := range t.holes { // punches waiting: the agent forgets everything
		if d := t.holes[i].done; d != nil {
			close(d)
			t.holes[i].done = nil
		}
	}
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

// mapped is the shmem file a process maps at a range: the file (opened
// through /proc/PID/map_files), its identity, and what the range maps.
type mapped struct {
	file *os.File
	key  segKey
	size uint64 // the file's, in whole pages
	// blocks: it held pages (st_blocks) when opened.
	blocks bool
	anon   bool   // MAP_SHARED|MAP_ANONYMOUS: reachable only through its mappings
	off    uint64 // the file offset of the range's start
	whole  bool   // the range lies inside one mapping of the file
	pid    int
	at     procinfo.Mapping // the mapping that holds the range's start
}

// identify opens the shmem file that [start, start+len) of process pid
// maps. An error means no segment is known (the mapping is not of shared
// memory, or went); !whole that the range is not one mapping's.
func identify(pid int, rng userfaultfd.Range) (*mapped, error) {
	end, _ := rng.End()
	m, err := procinfo.MappingAt(pid, uint64(rng.Start))
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.Start, m.End), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	var fs unix.Statfs_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("not shared memory (file system %#x)", fs.Type)
	}
	return &mapped{file: f, key: segKey{st.Dev, st.Ino}, size: (uint64(st.Size) + pageSize - 1) &^ (pageSize - 1),
		blocks: st.Blocks != 0, anon: st.Nlink == 0 && m.Anon, off: m.Offset + uint64(rng.Start) - m.Start,
		whole: uint64(end) <= m.End, pid: pid, at: m}, nil
}

// open finds or makes the segment of mp (its file is the segment's or
// closed). Errors refuse the mapping (it stays ordinary memory): one of a
// segment paged has it released first, since its process would read the
// evicted pages as holes.
func (t *sharedTable) open(mp *mapped) (*segment, error) {
	t.create.Lock()
	t.mu.Lock()
	s := t.segs[mp.key]
	var lost, releasing bool
	if s != nil {
		lost, releasing = s.gone && s.lost != nil, s.released != nil
	}
	t.mu.Unlock()
	if s == nil {
		s, err := t.make(mp)
		t.create.Unlock()
		if err != nil {
			mp.file.Close()
		}
		return s, err
	}
	t.create.Unlock() // a release waits for the owner's loop: not under create
	mp.file.Close()
	switch {
	case lost && mp.whole:
		return s, nil // paged no more, but its lost pages must fault
	case !mp.whole:
		return nil, t.refuseReleasing(s, "a range that is not one mapping of it")
	case releasing:
		return nil, t.refuseReleasing(s, "a mapping made while it is being released")
	}
	return s, nil
}

// refuseReleasing releases s (its new mapping, refused, is not a proxy),
// and returns the refusal.
func (t *sharedTable) refuseReleasing(s *segment, why string) error {
	if err := t.release(s, why); err != nil {
		return fmt.Errorf("%s, and releasing the segment failed: %w", why, err)
	}
	return fmt.Errorf("%s: the segment is paged no more", why)
}

// make makes the segment of mp, a file no segment pages. Preconditions:
// t.create held.
func (t *sharedTable) make(mp *mapped) (*segment, error) {
	switch {
	case !mp.whole:
		return nil, errors.New("the range is not one mapping")
	case mp.blocks:
		return nil, errors.New("the segment holds pages already: not paged")
	case mp.size == 0:
		return nil, errors.New("the segment is empty")
	}
	if err := t.start(); err != nil {
		return nil, err
	}
	if err := t.watch(mp); err != nil {
		return nil, err
	}
	mem, err := t.owner.MapShared(mp.file, int(mp.size))
	if err != nil {
		t.unwatch(mp.file)
		return nil, err
	}
	s := &segment{key: mp.key, file: mp.file, mem: mem, anon: mp.anon,
		wp: newPageBits(mp.size / pageSize)}
	t.mu.Lock()
	err = t.link(s)
	if err == nil {
		t.segs[mp.key] = s
	}
	t.mu.Unlock()
	if err != nil {
		t.owner.Unmap(mem)
		t.unwatch(mp.file)
		return nil, err
	}
	return s, nil
}

// watch has the opens of mp's file by processes that would not map it
// through the shim held until the segment is released (opened), and
// checks that no such process holds it already. A named segment is not
// paged without that guard; an anonymous one has no name to be opened by
// (only root can, through /proc/PID/map_files: held, too, when the guard
// is there). Preconditions: t.create held.
func (t *sharedTable) watch(mp *mapped) error {
	if t.guard == nil && t.guardErr == nil {
		t.guard, t.guardErr = fsguard.New(t.opened)
		if t.guardErr != nil {
			t.a.log.Warn("shared memory files are paged only when the agent can hold back processes outside it that open them; it cannot (fanotify needs CAP_SYS_ADMIN)", zap.Error(t.guardErr))
		}
	}
	if t.guard == nil {
		if mp.anon {
			return nil
		}
		return fmt.Errorf("no guard against processes outside the agent: %w", t.guardErr)
	}
	if err := t.guard.Watch(int(mp.file.Fd())); err != nil {
		return err
	}
	if err := t.onlyMapping(mp); err != nil {
		t.unwatch(mp.file)
		return err
	}
	return nil
}

// onlyMapping checks that the mapping being announced (mp, of process
// mp.pid) is the file's only one, and that the processes holding it open
// are paged through the shim (their mappings will be proxies): one made
// before could not be. A process that opens it later is held (opened).
func (t *sharedTable) onlyMapping(mp *mapped) error {
	hs, err := procinfo.Holders(mp.key.dev, mp.key.ino)
	if err != nil {
		return err
	}
	for _, h := range hs {
		if h.PID != os.Getpid() && !t.a.mapsSharedThroughShim(h.PID) {
			return fmt.Errorf("process %d, which this agent does not page through the shim, holds it", h.PID)
		}
		for _, m := range h.Maps {
			if h.PID != mp.pid || m.Start != mp.at.Start || m.End != mp.at.End {
				return fmt.Errorf("process %d maps it at %#x-%#x already, where it is not paged", h.PID, m.Start, m.End)
			}
		}
	}
	return nil
}

func (t *sharedTable) unwatch(f *os.File) {
	if t.guard != nil {
		t.guard.Unwatch(int(f.Fd()))
	}
}

// opened decides an open or read of a watched file by process pid
// (fsguard): a process paged by this agent through the shim may open it
// (it maps it as a proxy); any other open, and any read(2), would read
// the evicted pages as holes, so the segment is released first, brought
// back whole into its file (or the call is refused, EPERM, if that fails).
func (t *sharedTable) opened(pid int, key fsguard.Key, op fsguard.Op) bool {
	if op == fsguard.Open && t.a.mapsSharedThroughShim(pid) {
		return true
	}
	t.mu.Lock()
	s := t.segs[segKey{key.Dev, key.Ino}]
	t.mu.Unlock()
	if s == nil {
		return true
	}
	why := fmt.Sprintf("opened by process %d, which this agent does not page through the shim", pid)
	if op == fsguard.Read {
		why = fmt.Sprintf("read (read(2)) by process %d", pid)
	}
	if err := t.release(s, why); err != nil {
		t.a.log.Error("a process outside the agent opening a shared memory segment is refused (EPERM): the segment could not be released", zap.Int("pid", pid), zap.Error(err))
		return false
	}
	t.mu.Lock()
	lost := s.lost != nil
	t.mu.Unlock()
	if lost {
		t.a.log.Error("refused (EPERM): a shared memory segment with pages the pool lost is opened or read outside the agent's proxies, where they would read as zeros", zap.Int("pid", pid))
		return false
	}
	return true
}

// census counts the segments paged, and those kept unpaged for their lost
// pages, and returns how many were released.
func (t *sharedTable) census() (paged, lost int, releases uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.segs {
		switch {
		case !s.gone:
			paged++
		case s.lost != nil:
			lost++
		}
	}
	return paged, lost, t.releases
}

// releaseWait bounds how long release waits for the owner's loop.
const releaseWait = 30 * time.Second

// release stops paging segment s for good while processes still map it
// (why says what made it): its pages in the pool are written back into
// its file by the owner's loop (unpageSegments), then the owner drops it;
// its proxies stay registered, and the holes they fault on afterwards
// (pages a process punched) are zeros. It returns once the segment is
// back in its file.
func (t *sharedTable) release(s *segment, why string) error {
	t.mu.Lock()
	switch {
	case s.released == nil && t.closed:
		t.mu.Unlock()
		return errors.New("agent closing")
	case s.released == nil:
		t.a.log.Info("releasing a shared memory segment: it is brought back into its file and paged no more", zap.String("why", why))
		s.released = make(chan struct{})
		t.releases++
		if !s.unpage {
			s.unpage = true
			t.unpaging = append(t.unpaging, s)
		}
	}
	done, o := s.released, t.ownerC
	t.mu.Unlock()
	if o != nil {
		o.wake()
	}
	select {
	case <-done:
		return nil
	case <-time.After(releaseWait):
		return errors.New("timed out waiting for the owner to bring it back into its file")
	}
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

// join makes proxy region r a mapper of its segment. The victims of an
// eviction in flight are protected in it as in the mappers the eviction
// knew (a forked child's copy of its parent's mapping, made before the
// eviction protected them; a new mapping): a write there after the copy
// would be lost to the punch.
func (t *sharedTable) join(r *region) {
	s := r.px.seg
	if s == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s.mappers = append(s.mappers, r)
	s.wp.runs(func(lo, n uint64) {
		if err := t.each(r, int(lo), int(n), writeProtect); err != nil {
			t.a.log.Warn("protecting a new mapping of a segment being evicted failed: a write there meanwhile may be lost", zap.Error(err))
		}
	})
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
	case len(s.mappers) > 0 || t.closed || s.unpage || s.gone:
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
// caller). One with lost pages is kept (its file watched, its proxies
// poisoned there): only the owner's mapping goes. Preconditions: t.mu
// held, not closed.
func (t *sharedTable) dropLocked(s *segment) {
	keep := s.lost != nil
	if !keep {
		delete(t.segs, s.key)
	}
	delete(t.byReg, s.reg.id)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if err := t.owner.Unmap(s.mem); err != nil && !errors.Is(err, rmemclient.ErrClosed) {
			t.a.log.Warn("dropping a shared memory segment", zap.Error(err))
		}
		if !keep {
			t.unwatch(s.file)
			s.file.Close()
		}
	}()
}

// markLost records pages of s that could not be brought back into its
// file.
func (t *sharedTable) markLost(s *segment, pages []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.lost == nil {
		s.lost = newPageBits(s.size() / pageSize)
	}
	for _, q := range pages {
		s.lost.set(uint64(q), 1, true)
	}
}

// doneUnpaging takes s off the list, and with drop, drops it unless a
// process maps it again and it is not being released. Called by the
// owner's loop.
func (t *sharedTable) doneUnpaging(s *segment, drop bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.unpaging, s); i >= 0 {
		t.unpaging = slices.Delete(t.unpaging, i, i+1)
	}
	s.unpage = false
	switch {
	case s.released != nil:
		s.gone = true
		if drop && !t.closed {
			t.dropLocked(s)
		}
		close(s.released)
	case s.lost != nil && drop && !t.closed:
		// Unmapped, with pages lost: kept, paged no more (as released).
		s.gone = true
		s.released = make(chan struct{})
		close(s.released)
		t.dropLocked(s)
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
		c.poisonLost(a)
		return
	}
	off := px.off + uint64(a-r.start)
	t.mu.Lock()
	s := px.seg
	gone, lost, busy := s.gone, s.lost.has(off/pageSize), !s.gone && s.wp.has(off/pageSize)
	t.mu.Unlock()
	switch {
	case flags&userfaultfd.FaultWP != 0:
		if !busy {
			unprotectOrWake(c.uffd.faultFD, pageRange(a))
		}
		return
	case gone && lost:
		c.poisonLost(a)
		return
	}
	if off >= s.size() || gone {
		// Past the end the segment had when first mapped (it grew):
		// never paged, so a hole there is one. Or the segment was
		// released, every page brought back into its file: a hole there
		// is one a process punched.
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
	if s := px.seg; s.gone {
		o = nil // the process's punch is all there is to it: zeros, lost or not
		s.lost.set(off/pageSize, rng.Len/pageSize, false)
	}
	done := make(chan struct{})
	if o != nil && !t.closed {
		t.holes = append(t.holes, holeFault{r: r, seg: px.seg, off: off, zap: rng.Len, done: done})
	} else {
		close(done)
	}
	t.mu.Unlock()
	if o != nil {
		o.wake()
	}
	// The process punches once answered: not before the owner has
	// forgotten the pages, and has served the holes it was serving (a
	// READ in flight would put the pool's copy back after the punch).
	select {
	case <-done:
	case <-time.After(releaseWait):
		t.a.log.Warn("a punch of shared memory did not wait for the owner's loop to forget its pages", zap.Stringer("range", rng))
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
	s.wp.set(uint64(lo), uint64(n), true)
	for i, m := range s.mappers {
		if err := t.each(m, lo, n, writeProtect); err != nil {
			for _, m := range s.mappers[:i+1] {
				t.each(m, lo, n, unprotectOrWake)
			}
			s.wp.set(uint64(lo), uint64(n), false)
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
	s.wp.set(uint64(lo), uint64(n), false)
	for _, m := range s.mappers {
		t.each(m, lo, n, unprotectOrWake)
	}
}

func writeProtect(u faultFD, rg userfaultfd.Range) error { return u.WriteProtect(rg) }

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
// A mapping the shim does not page (proto.RegionUnpaged), one of a client
// whose faults the agent does not take from its uffd (the fault ring, a
// traced process), and one refused for another reason (bad, addRegion's:
// e.g. it lies inside a region's span, mapped MAP_FIXED into memory the
// process reserved) are refused, and have the segment released if it is
// paged: their process would read its evicted pages as holes.
func (c *client) addProxy(m *proto.RegionAdd, bad error) error {
	rng := m.Range
	refuse := func(err error) error {
		c.log.Info("shared memory not paged", zap.Stringer("range", rng), zap.Error(err))
		return errWithErrno(unix.EINVAL, "shared memory not paged: "+err.Error())
	}
	mp, err := identify(int(c.pidAtm.Load()), rng)
	if err != nil {
		return refuse(err)
	}
	t := c.a.shm
	why := ""
	switch {
	case m.Flags&proto.RegionUnpaged != 0:
		why = "mapped where the shim cannot page it"
	case !c.proxiesShared():
		why = "mapped by a client paged without the shim's uffd"
	case bad != nil:
		why = bad.Error()
	}
	if why != "" {
		mp.file.Close()
		t.mu.Lock()
		s := t.segs[mp.key]
		t.mu.Unlock()
		err := errors.New(why)
		if s != nil {
			err = t.refuseReleasing(s, why)
		}
		if bad != nil {
			c.log.Info("shared memory not paged", zap.Stringer("range", rng), zap.Error(err))
			return bad
		}
		return refuse(err)
	}
	seg, err := t.open(mp)
	if err != nil {
		return refuse(err)
	}
	c.addProxyRegion(m, seg, mp.off)
	return nil
}

// addProxyRegion adds m's region to c, a proxy of seg (nil: lost) whose
// start maps offset off, a mapper of seg.
func (c *client) addProxyRegion(m *proto.RegionAdd, seg *segment, off uint64) {
	r := &region{id: m.ID, start: m.Range.Start, kind: m.Kind, plen: m.Range.Len,
		px: &proxy{seg: seg, off: off, c: c, live: []userfaultfd.Range{m.Range}}}
	c.regs.add(r)
	c.a.shm.join(r)
	c.st.regions.Add(1)
}

// handoff answers a HANDOFF on c's connection (proto.Handoff): for c's
// own process only (a child of it that is not connected speaks on a
// connection of its own: Agent.handoffOnce).
func (c *client) handoff(m *proto.Handoff) error {
	if pid := c.pidAtm.Load(); int64(m.PID) != pid {
		return errWithErrno(unix.EPERM, fmt.Sprintf("HANDOFF of process %d from the client of process %d", m.PID, pid))
	}
	return c.a.shm.handoff(m)
}

// handoff releases the segments the agent pages that descriptors of
// process m.PID reach, which are about to leave the agent's sight
// (proto.Handoff): those m names, and on exec every one kept across it. A
// new program without the shim, or a process that receives one over a
// socket, could map the segment without opening it, which the guard does
// not see, and read its evicted pages as holes. A segment with pages the
// pool lost is refused (EPERM): they would read as zeros there.
func (t *sharedTable) handoff(m *proto.Handoff) error {
	if !t.any() {
		return nil
	}
	pid := int(m.PID)
	named := m.FDs[:m.N]
	var files []procinfo.File
	var err error
	if m.Flags&proto.HandoffExec != 0 {
		files, err = procinfo.Files(pid) // what the exec keeps: every descriptor not close-on-exec
	} else {
		fds := make([]int, len(named))
		for i, fd := range named {
			fds[i] = int(fd)
		}
		files, err = procinfo.FilesOf(pid, fds) // the descriptors named only
	}
	if err != nil {
		return errWithErrno(unix.ESRCH, err.Error())
	}
	var segs []*segment
	t.mu.Lock()
	for _, f := range files {
		exec := m.Flags&proto.HandoffExec != 0 && !f.CloseOnExec
		if s := t.segs[segKey{f.Dev, f.Ino}]; s != nil && (exec || slices.Contains(named, int32(f.FD))) && !slices.Contains(segs, s) {
			segs = append(segs, s)
		}
	}
	t.mu.Unlock()
	why := handoffWhy(pid, m.Flags)
	for _, s := range segs {
		if err := t.release(s, why); err != nil {
			t.a.log.Error("refused (EPERM): a descriptor of a shared memory segment that could not be released leaves the agent's sight", zap.Int("pid", pid), zap.Error(err))
			return errWithErrno(unix.EPERM, "shared memory segment could not be released: "+err.Error())
		}
		t.mu.Lock()
		lost := s.lost != nil
		t.mu.Unlock()
		if lost {
			t.a.log.Error("refused (EPERM): a descriptor of a shared memory segment with pages the pool lost leaves the agent's sight, where they would read as zeros", zap.Int("pid", pid))
			return errWithErrno(unix.EPERM, "shared memory segment has pages the pool lost")
		}
	}
	return nil
}

// handoffWhy says what a HANDOFF of process pid with flags f is, for the
// log.
func handoffWhy(pid int, f proto.HandoffFlags) string {
	switch {
	case f&proto.HandoffExec != 0:
		return fmt.Sprintf("a descriptor of it goes with process %d's exec", pid)
	case f&proto.HandoffIO != 0:
		return fmt.Sprintf("read(2) or write(2) by process %d through a descriptor opened before it was paged", pid)
	}
	return fmt.Sprintf("a descriptor of it is passed over a socket by process %d", pid)
}

// any reports whether t has a segment, paged or kept for its lost pages.
func (t *sharedTable) any() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.segs) > 0
}

// proxiesShared reports whether c's mappings of shared memory are proxies:
// it is the shim (proto.HelloShared), which announces them, with faults
// from its uffd (no fault ring, not traced).
func (c *client) proxiesShared() bool {
	return c.says(proto.HelloShared) && !c.says(proto.HelloTraced) && c.ring == nil
}

// poisonLost makes proxy page a of c raise SIGBUS: the segment's page
// there is not in the pool (lost) nor in the file. A page whose
// process's address space is changing faults again.
func (c *client) poisonLost(a userfaultfd.Addr) {
	if err := c.poisonAt(a, "a shared memory page is in neither the pool nor its file"); err != nil {
		c.uffd.Wake(pageRange(a))
	}
}

// mapsSharedThroughShim reports whether process pid is a client of a
// whose mappings of shared memory are proxies (proxiesShared).
func (a *Agent) mapsSharedThroughShim(pid int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.clients {
		if int(c.pidAtm.Load()) == pid && c.proxiesShared() {
			return true
		}
	}
	return false
}
