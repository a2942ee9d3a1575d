package pager

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/remote"
	"rmem/procinfo"
	"rmem/userfaultfd"
)

// The journal is what an agent leaves for the one after it on the node
// (killed, crashed, restarted: Options.StateDir), so that its programs,
// which keep their uffd and regions, lose no page: which slab is which slot
// number, and per client its regions, the pool slot of each page and what
// its staging slots hold. It lives on a tmpfs (/run), which survives the
// agent's death but not the node's (nor do the programs).
//
// The slot tables are the region's own: a region's slots []Slot is a
// MAP_SHARED mapping of its file, so recording where a page is costs one
// store, and every store survives the agent's death (it is in the page
// cache). The rest is append-only logs of rare events (slabs, regions),
// written before they take effect.
//
// What the next agent derives rather than reads: whether a page is
// resident (from /proc/PID/pagemap), and whether it is clean (its uffd-wp
// bit). The order that makes it safe: a dirty victim's staging slot is
// recorded, then the pool slot its write-back will use, both before the
// EVICT that drops it; a page whose staging entry is set is dirty if
// resident and Staged (its data in the staging slot) if not; a slot is
// recorded for a page only as long as its pool copy is valid or being made.
//
// Layout in StateDir: slabs.log (16-byte records: slab number u32, op
// u32, slab id u64), lease (the lease id), and per client c<ID>/: meta.json,
// regions.log (32-byte records: op u32, kind u32, region id u64, start u64,
// length u64), r<regionID>.slots (4 bytes a page) and staging (16 bytes a
// staging slot: region id u64, page u32, 1 if in use u32).

const (
	opAdd  = 1
	opFree = 2 // slabs.log; regions.log: the region is gone
)

// journal is an agent's state directory.
type journal struct {
	dir   string
	slabs *os.File // slabs.log, appended
}

func openJournal(dir string) (*journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pager: state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "slabs.log"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pager: state dir: %w", err)
	}
	return &journal{dir: dir, slabs: f}, nil
}

func (j *journal) close() {
	if j != nil {
		j.slabs.Close()
	}
}

// slabEvent records that slab number num holds id (opAdd) or is free.
func (j *journal) slabEvent(op uint32, num int, id remote.SlabID) error {
	if j == nil {
		return nil
	}
	var rec [16]byte
	binary.LittleEndian.PutUint32(rec[0:], uint32(num))
	binary.LittleEndian.PutUint32(rec[4:], op)
	binary.LittleEndian.PutUint64(rec[8:], uint64(id))
	_, err := j.slabs.Write(rec[:])
	return err
}

// loadSlabs replays slabs.log: the slab id of each slab number.
func (j *journal) loadSlabs() (map[int]remote.SlabID, error) {
	b, err := os.ReadFile(filepath.Join(j.dir, "slabs.log"))
	if err != nil {
		return nil, err
	}
	m := map[int]remote.SlabID{}
	for ; len(b) >= 16; b = b[16:] {
		num := int(binary.LittleEndian.Uint32(b))
		switch binary.LittleEndian.Uint32(b[4:]) {
		case opAdd:
			m[num] = remote.SlabID(binary.LittleEndian.Uint64(b[8:]))
		case opFree:
			delete(m, num)
		}
	}
	return m, nil
}

// rewriteSlabs replaces slabs.log by the records of m (compaction at
// start).
func (j *journal) rewriteSlabs(m map[int]remote.SlabID) error {
	var buf bytes.Buffer
	for num, id := range m {
		var rec [16]byte
		binary.LittleEndian.PutUint32(rec[0:], uint32(num))
		binary.LittleEndian.PutUint32(rec[4:], opAdd)
		binary.LittleEndian.PutUint64(rec[8:], uint64(id))
		buf.Write(rec[:])
	}
	if err := j.slabs.Truncate(0); err != nil {
		return err
	}
	_, err := j.slabs.Write(buf.Bytes())
	return err
}

// SaveLease records in StateDir dir the lease an agent holds and its
// secret (pool.Lease.Secret: what shows the coordinator the lease is
// ours), for the one after it (PreviousLease). The file is the owner's
// only (0600).
func SaveLease(dir, id, secret string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "lease"), []byte(id+"\n"+secret+"\n"), 0o600)
}

// PreviousLease returns the lease id and secret an agent left in StateDir
// dir, or "".
func PreviousLease(dir string) (id, secret string) {
	b, err := os.ReadFile(filepath.Join(dir, "lease"))
	if err != nil {
		return "", ""
	}
	id, secret, _ = strings.Cut(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(id), strings.TrimSpace(secret)
}

// clientMeta identifies a client's process across agents.
type clientMeta struct {
	PID      int    `json:"pid"`
	Start    uint64 `json:"start"` // its start time (/proc/PID/stat), against pid reuse
	UID      uint32 `json:"uid"`
	LocalMem uint64 `json:"local_mem"`
	Features uint64 `json:"features"`
	Staging  int    `json:"staging_slots"`
	Forks    uint64 `json:"forks"`
}

// clientJournal is one client's part of the journal. A nil one records
// nothing (no StateDir, or a client whose journal could not be made).
type clientJournal struct {
	dir     string
	regions *os.File
	staging []byte // mapping of the staging file: 16 bytes a slot
}

func (j *journal) clientDir(id uint64) string {
	return filepath.Join(j.dir, "c"+strconv.FormatUint(id, 10))
}

// newClient makes client id's journal (replacing what an older one left).
func (j *journal) newClient(id uint64, meta clientMeta) (*clientJournal, error) {
	if j == nil {
		return nil, nil
	}
	dir := j.clientDir(id)
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	cj, err := openClientJournal(dir, meta.Staging, true)
	if err == nil {
		err = cj.saveMeta(meta)
	}
	if err != nil {
		cj.remove()
		return nil, err
	}
	return cj, nil
}

func openClientJournal(dir string, stagingSlots int, create bool) (*clientJournal, error) {
	flag := os.O_RDWR | os.O_APPEND
	if create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(filepath.Join(dir, "regions.log"), flag, 0o600)
	if err != nil {
		return nil, err
	}
	cj := &clientJournal{dir: dir, regions: f}
	if cj.staging, err = mapFile(filepath.Join(dir, "staging"), stagingSlots*16, create); err != nil {
		f.Close()
		return nil, err
	}
	return cj, nil
}

func (cj *clientJournal) saveMeta(m clientMeta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cj.dir, "meta.json"), b, 0o600)
}

// mapFile maps file (size bytes, made if create) shared, read/write.
func mapFile(file string, size int, create bool) ([]byte, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(file, flag, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if create {
		if err := f.Truncate(int64(size)); err != nil {
			return nil, err
		}
	} else if fi, err := f.Stat(); err != nil || fi.Size() != int64(size) {
		return nil, fmt.Errorf("pager: journal file %s: size %v, want %d (%v)", file, fi.Size(), size, err)
	}
	if size == 0 {
		return []byte{}, nil
	}
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func unmap(b []byte) {
	if len(b) > 0 {
		unix.Munmap(b)
	}
}

func (cj *clientJournal) slotsFile(id uint64) string {
	return filepath.Join(cj.dir, "r"+strconv.FormatUint(id, 10)+".slots")
}

// regionEvent appends a region record.
func (cj *clientJournal) regionEvent(op uint32, r *region) error {
	var rec [32]byte
	binary.LittleEndian.PutUint32(rec[0:], op)
	binary.LittleEndian.PutUint32(rec[4:], uint32(r.kind))
	binary.LittleEndian.PutUint64(rec[8:], r.id)
	binary.LittleEndian.PutUint64(rec[16:], uint64(r.start))
	binary.LittleEndian.PutUint64(rec[24:], uint64(len(r.pages))*pageSize)
	_, err := cj.regions.Write(rec[:])
	return err
}

// addRegion gives r a slot table backed by a file of the journal; on
// failure r keeps a plain one (its pages would be lost to a next agent:
// the caller says so).
func (cj *clientJournal) addRegion(r *region) error {
	if cj == nil {
		return nil
	}
	b, err := mapFile(cj.slotsFile(r.id), len(r.pages)*4, true)
	if err == nil {
		if err = cj.regionEvent(opAdd, r); err != nil {
			unmap(b)
		}
	}
	if err != nil {
		return err
	}
	copy(b, slotBytes(r.slots))
	r.slots = bytesSlots(b)
	r.mapped = true
	return nil
}

// delRegion forgets r (its slots are released already).
func (cj *clientJournal) delRegion(r *region) {
	if cj == nil || !r.mapped {
		return
	}
	cj.regionEvent(opFree, r)
	unmap(slotBytes(r.slots))
	r.slots, r.mapped = make([]Slot, len(r.pages)), false
	os.Remove(cj.slotsFile(r.id))
}

// stage records that staging slot s holds page idx of region id (in use)
// or nothing.
func (cj *clientJournal) stage(s int, id uint64, idx int, inUse bool) {
	if cj == nil || (s+1)*16 > len(cj.staging) {
		return
	}
	e := cj.staging[s*16 : (s+1)*16]
	binary.LittleEndian.PutUint64(e[0:], id)
	binary.LittleEndian.PutUint32(e[8:], uint32(idx))
	v := uint32(0)
	if inUse {
		v = 1
	}
	binary.LittleEndian.PutUint32(e[12:], v)
}

// remove deletes the client's journal (its process is gone).
func (cj *clientJournal) remove() {
	if cj == nil {
		return
	}
	cj.regions.Close()
	unmap(cj.staging)
	os.RemoveAll(cj.dir)
}

// detach unmaps the journal, leaving it for a next agent (this one is
// closing with the client alive).
func (cj *clientJournal) detach(regs []*region) {
	if cj == nil {
		return
	}
	for _, r := range regs {
		if r.mapped {
			unmap(slotBytes(r.slots))
			r.slots, r.mapped = nil, false
		}
	}
	cj.regions.Close()
	unmap(cj.staging)
}

// orphan is a client an agent before this one served, whose process is
// alive: its journal, waiting for the process to say HELLO again.
type orphan struct {
	id      uint64
	meta    clientMeta
	cj      *clientJournal
	regions []*region // slots mapped from the journal; page states not known yet
	staged  map[int]pageRef
}

// loadOrphan reads the journal dir of a client of a previous agent.
func loadOrphan(dir string, id uint64) (*orphan, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	o := &orphan{id: id, staged: map[int]pageRef{}}
	if err := json.Unmarshal(b, &o.meta); err != nil {
		return nil, fmt.Errorf("pager: %s: %w", dir, err)
	}
	if o.cj, err = openClientJournal(dir, o.meta.Staging, false); err != nil {
		return nil, err
	}
	log, err := io.ReadAll(io.NewSectionReader(o.cj.regions, 0, 1<<40))
	if err != nil {
		o.cj.detach(nil)
		return nil, err
	}
	live := map[uint64]*region{}
	var order []uint64
	for ; len(log) >= 32; log = log[32:] {
		op := binary.LittleEndian.Uint32(log)
		rid := binary.LittleEndian.Uint64(log[8:])
		switch op {
		case opAdd:
			n := int(binary.LittleEndian.Uint64(log[24:]) / pageSize)
			live[rid] = &region{id: rid, start: userfaultfd.Addr(binary.LittleEndian.Uint64(log[16:])), pages: make(PageTable, n)}
			order = append(order, rid)
		case opFree:
			delete(live, rid)
		}
	}
	for _, rid := range order {
		r := live[rid]
		if r == nil || r.slots != nil {
			continue
		}
		m, err := mapFile(o.cj.slotsFile(rid), len(r.pages)*4, false)
		if err != nil {
			o.cj.detach(o.regions)
			return nil, err
		}
		r.slots, r.mapped = bytesSlots(m), true
		o.regions = append(o.regions, r)
	}
	byID := map[uint64]*region{}
	for _, r := range o.regions {
		byID[r.id] = r
	}
	for s := 0; (s+1)*16 <= len(o.cj.staging); s++ {
		e := o.cj.staging[s*16:]
		if binary.LittleEndian.Uint32(e[12:]) != 1 {
			continue
		}
		r, idx := byID[binary.LittleEndian.Uint64(e)], int(binary.LittleEndian.Uint32(e[8:]))
		if r != nil && idx < len(r.pages) {
			o.staged[s] = pageRef{r, idx}
		}
	}
	return o, nil
}

// listClients returns the client ids that have a journal in dir.
func (j *journal) listClients() []uint64 {
	ents, _ := os.ReadDir(j.dir)
	var ids []uint64
	for _, e := range ents {
		if v, ok := strings.CutPrefix(e.Name(), "c"); ok && e.IsDir() {
			if id, err := strconv.ParseUint(v, 10, 64); err == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// errJournal wraps failures to keep a journal: the client is served, but
// its pages would be lost to a next agent.
var errJournal = errors.New("pager: journal")

// startJournal gives client c (process pid of user uid) a journal, and
// records its regions so far. Without one its pages would be lost to a
// next agent: said once, and it is served anyway.
func (c *client) startJournal(pid int, uid uint32) {
	if c.a.journal == nil || c.cj != nil {
		return
	}
	start, err := procStart(pid)
	if err == nil {
		c.cj, err = c.a.journal.newClient(c.id, c.meta(pid, start, uid))
	}
	for _, r := range c.regs.list {
		if err == nil {
			err = c.cj.addRegion(r)
		}
	}
	if err != nil {
		c.log.Warn("no journal for this client: if the agent dies, its pages in the pool are lost to it", zap.Error(err))
		c.cj.remove()
		c.cj = nil
	}
}

func (c *client) meta(pid int, start uint64, uid uint32) clientMeta {
	return clientMeta{PID: pid, Start: start, UID: uid, LocalMem: c.bud.localMem.Load(), Features: uint64(c.features),
		Staging: len(c.ev.stageOwner), Forks: c.fk.forks}
}

// journalRegion records a new region in the client's journal.
func (c *client) journalRegion(r *region) {
	if err := c.cj.addRegion(r); err != nil {
		c.log.Warn("a region could not be journaled: if the agent dies, its pages in the pool are lost to the program", zap.Error(err))
	}
}

// forked records the client's fork count (the serial its children's HELLO
// name), which a next agent must go on from.
func (c *client) forked() {
	if c.cj != nil {
		if start, err := procStart(int(c.pidAtm.Load())); err == nil {
			c.cj.saveMeta(c.meta(int(c.pidAtm.Load()), start, c.uid.Load()))
		}
	}
}

// procStart returns process pid's start time (clock ticks since boot),
// which tells it from a later process with the same pid.
func procStart(pid int) (uint64, error) {
	s, err := procinfo.ReadStat(pid)
	return s.Start, err
}
