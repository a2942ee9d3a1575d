package proto

import (
	"fmt"
	"math/bits"

	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

// Body sizes.
const (
	helloSize      = 48
	welcomeSize    = 24
	regionAddSize  = 32
	regionDelSize  = 24
	ackSize        = 8
	errorFixed     = 8
	evictFixed     = 16
	evictEntry     = 16
	evictedSize    = 16
	forkSize       = 16
	resumeDoneSize = 8
	handoffSize    = 16 + 4*HandoffMaxFDs
)

// HelloFlags are bits of Hello.Flags.
type HelloFlags uint32

// HelloUFFD: the uffd rides with the HELLO as SCM_RIGHTS. Set by
// top-level processes (ForkSerial 0), and by a child forked without FORK
// events (its parent's uffd lacks UFFD_FEATURE_EVENT_FORK, which needs
// CAP_SYS_PTRACE): the child registered its regions with a uffd of its
// own, and the agent pairs it with the parent's FORK_PREPARE. A child
// forked with a FORK event sends no uffd: the agent has it from the event.
const HelloUFFD HelloFlags = 1 << 0

// HelloResume: the process's agent went away (killed, restarted) and it
// says HELLO again, to whichever agent serves the socket now, keeping its
// uffd and regions: HelloUFFD is set too, and its staging memfd rides as a
// second descriptor. The agent answers WELCOME (with WelcomeResumed if it
// took over the journal the previous agent left), then the shim
// re-announces its regions (REGION_ADD with RegionResumed) and sends
// RESUME_DONE; the agent serves no fault of the process before that.
const HelloResume HelloFlags = 1 << 1

// HelloRing: the process's page faults come through the fault ring (ring.go)
// instead of its uffd: the uffd was made with UFFD_FEATURE_SIGBUS, so a
// fault raises SIGBUS in the faulting thread, whose handler posts it to the
// ring and waits there for the agent (docs/pager.md, Misses in the
// faulting thread). The agent answers WELCOME with WelcomeRing, or
// refuses the HELLO.
const HelloRing HelloFlags = 1 << 2

// HelloTraced: the HELLO speaks for PID, a process the sender traces
// (ptrace: /proc/PID/status names the sender as its TracerPid), not for
// the sender itself: `memagent run` pages a program the shim cannot reach
// (a static binary, a Go program) from outside it (package traced). The
// uffd that rides with it is PID's; HelloUFFD is set. A fork serial N
// names the FORK_PREPARE of PPID that made PID's copy of its pages, as a
// shim's child forked without FORK events does.
const HelloTraced HelloFlags = 1 << 3

// HelloShared: the sender is the shim, which announces every mapping of
// shared memory it makes (proto.KindShared, refused or not): the agent
// lets it open a segment it pages (docs/pager.md, "Shared memory"); a
// process without it that opens one has the segment brought back into its
// file first. Not with HelloTraced.
const HelloShared HelloFlags = 1 << 4

// Hello is the shim's first message on a connection.
type Hello struct {
	PID        int32               // the sender (the agent checks it against SO_PEERCRED), or the process it traces (HelloTraced)
	PPID       int32               // its parent
	ForkSerial uint64              // 0: top-level; N: the Nth FORK event on the parent's uffd
	Features   userfaultfd.Feature // features the uffd's handshake enabled
	PageSize   uint32              // the sender's base page size
	Flags      HelloFlags
	// LocalMem is the resident bytes the process asks to be kept under
	// (memagent run --local-mem, passed in EnvLocalMem); 0: the agent's
	// default.
	LocalMem uint64
	// MaxSlowdown, in millionths, has the agent steer the process's
	// budget by its paging stall (memagent run --max-slowdown, passed in
	// EnvMaxSlowdown; LocalMem, if set, is then its ceiling); 0: the
	// agent's default.
	MaxSlowdown uint32
}

func (*Hello) Type() Type { return TypeHello }

func (m *Hello) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeHello, seq, helloSize)
	b = le.AppendUint32(b, uint32(m.PID))
	b = le.AppendUint32(b, uint32(m.PPID))
	b = le.AppendUint64(b, m.ForkSerial)
	b = le.AppendUint64(b, uint64(m.Features))
	b = le.AppendUint32(b, m.PageSize)
	b = le.AppendUint32(b, uint32(m.Flags))
	b = le.AppendUint64(b, m.LocalMem)
	b = le.AppendUint32(b, m.MaxSlowdown)
	return le.AppendUint32(b, 0)
}

func (m *Hello) Decode(body []byte) error {
	if err := checkLen(TypeHello, body, helloSize); err != nil {
		return err
	}
	h := Hello{
		PID:         int32(le.Uint32(body)),
		PPID:        int32(le.Uint32(body[4:])),
		ForkSerial:  le.Uint64(body[8:]),
		Features:    userfaultfd.Feature(le.Uint64(body[16:])),
		PageSize:    le.Uint32(body[24:]),
		Flags:       HelloFlags(le.Uint32(body[28:])),
		LocalMem:    le.Uint64(body[32:]),
		MaxSlowdown: le.Uint32(body[40:]),
	}
	switch {
	case h.PID <= 0:
		return fmt.Errorf("%w: HELLO pid %d", ErrMalformed, h.PID)
	case h.PPID < 0:
		return fmt.Errorf("%w: HELLO parent pid %d", ErrMalformed, h.PPID)
	case h.PageSize < 4096 || bits.OnesCount32(h.PageSize) != 1:
		return fmt.Errorf("%w: HELLO page size %d", ErrMalformed, h.PageSize)
	case h.ForkSerial == 0 && h.Flags&HelloUFFD == 0:
		return fmt.Errorf("%w: HELLO of a top-level process (fork serial 0) without its uffd", ErrMalformed)
	case h.Flags&HelloResume != 0 && (h.Flags&HelloUFFD == 0 || h.ForkSerial != 0):
		return fmt.Errorf("%w: a resuming HELLO carries the uffd, with fork serial 0", ErrMalformed)
	case h.Flags&HelloRing != 0 && !h.Features.Has(userfaultfd.FeatureSigbus):
		return fmt.Errorf("%w: HELLO asks for the fault ring with a uffd without UFFD_FEATURE_SIGBUS", ErrMalformed)
	case h.Flags&HelloRing == 0 && h.Features.Has(userfaultfd.FeatureSigbus):
		return fmt.Errorf("%w: HELLO with a UFFD_FEATURE_SIGBUS uffd, not asking for the fault ring", ErrMalformed)
	case h.Flags&HelloTraced != 0 && h.Flags&(HelloUFFD|HelloResume|HelloRing) != HelloUFFD:
		return fmt.Errorf("%w: a traced HELLO carries the uffd, and neither resumes nor asks for the ring", ErrMalformed)
	case h.Flags&HelloTraced != 0 && h.Flags&HelloShared != 0:
		return fmt.Errorf("%w: a traced HELLO does not announce shared memory", ErrMalformed)
	case h.Flags&^(HelloUFFD|HelloResume|HelloRing|HelloTraced|HelloShared) != 0:
		return fmt.Errorf("%w: HELLO flags %#x", ErrMalformed, uint32(h.Flags))
	}
	if err := reserved(TypeHello, "reserved", le.Uint32(body[44:])); err != nil {
		return err
	}
	*m = h
	return nil
}

// WelcomeFlags are bits of Welcome.Flags.
type WelcomeFlags uint32

// WelcomeUFFD: a second descriptor follows the staging memfd: the forked
// child's own uffd (the one the agent got from the FORK event), so that
// the child keeps a reference of its own (no silent zeros if the agent
// dies).
const WelcomeUFFD WelcomeFlags = 1 << 0

// WelcomeResumed answers a resuming HELLO: the agent took over the
// journal of the process's previous agent, so its pages in the pool come
// back. Without it, the agent knows nothing of them: touching a page of
// the process's regions that is not resident raises SIGBUS (never zeros).
const WelcomeResumed WelcomeFlags = 1 << 1

// WelcomeRing answers a HelloRing: the staging memfd holds the fault ring
// (RingSize bytes at offset StagingSlots pages, after the staging slots),
// and the client's doorbell, an eventfd the shim writes when the ring says
// the agent sleeps, rides as the last descriptor.
const WelcomeRing WelcomeFlags = 1 << 2

// Welcome accepts a HELLO. The staging memfd (StagingSlots pages of the
// client's page size, and the fault ring after them with WelcomeRing)
// rides as SCM_RIGHTS, then the child's uffd if Flags has WelcomeUFFD,
// then the doorbell if Flags has WelcomeRing.
type Welcome struct {
	ClientID     uint64
	MinAlloc     uint64 // the agent's threshold; RMEM_MIN_ALLOC in the client wins
	StagingSlots uint32 // pages in the staging memfd, 1..MaxStagingSlots
	Flags        WelcomeFlags
}

func (*Welcome) Type() Type { return TypeWelcome }

// FDs is the number of descriptors that ride with m.
func (m *Welcome) FDs() int {
	n := 1
	if m.Flags&WelcomeUFFD != 0 {
		n++
	}
	if m.Flags&WelcomeRing != 0 {
		n++
	}
	return n
}

func (m *Welcome) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeWelcome, seq, welcomeSize)
	b = le.AppendUint64(b, m.ClientID)
	b = le.AppendUint64(b, m.MinAlloc)
	b = le.AppendUint32(b, m.StagingSlots)
	return le.AppendUint32(b, uint32(m.Flags))
}

func (m *Welcome) Decode(body []byte) error {
	if err := checkLen(TypeWelcome, body, welcomeSize); err != nil {
		return err
	}
	w := Welcome{
		ClientID:     le.Uint64(body),
		MinAlloc:     le.Uint64(body[8:]),
		StagingSlots: le.Uint32(body[16:]),
		Flags:        WelcomeFlags(le.Uint32(body[20:])),
	}
	if w.StagingSlots == 0 || w.StagingSlots > MaxStagingSlots {
		return fmt.Errorf("%w: WELCOME with %d staging slots (1..%d)", ErrMalformed, w.StagingSlots, MaxStagingSlots)
	}
	if w.Flags&^(WelcomeUFFD|WelcomeResumed|WelcomeRing) != 0 {
		return fmt.Errorf("%w: WELCOME flags %#x", ErrMalformed, uint32(w.Flags))
	}
	*m = w
	return nil
}

// Kind says where a region came from. KindHeap and KindMmap are private
// anonymous memory, the kind is for statistics and logs. KindShared is a
// MAP_SHARED mapping of shared memory (a tmpfs or memfd file, or
// MAP_SHARED|MAP_ANONYMOUS): its pages are not the client's but the
// segment's, which the agent pages once for every process that maps it
// (docs/pager.md, "Shared memory").
type Kind uint32

const (
	KindHeap   Kind = 1 // malloc, calloc, realloc, posix_memalign & co.
	KindMmap   Kind = 2 // the program's own anonymous mmap (jemalloc, tcmalloc, …)
	KindShared Kind = 3 // a MAP_SHARED mapping of shared memory
)

func (k Kind) String() string {
	switch k {
	case KindHeap:
		return "heap"
	case KindMmap:
		return "mmap"
	case KindShared:
		return "shared"
	}
	return fmt.Sprintf("kind(%d)", uint32(k))
}

// RegionAdd announces a range the shim has registered (MISSING|WP) with
// its uffd. The shim returns the memory to the program only after the
// ACK, so the agent knows the region before its first fault.
type RegionAdd struct {
	ID    uint64 // unique among the client's live regions
	Range userfaultfd.Range
	Kind  Kind
	Flags RegionFlags
}

// RegionFlags are bits of RegionAdd.Flags.
type RegionFlags uint32

// RegionResumed: a region re-announced after a resuming HELLO: it is
// registered already, and its pages may be resident, in the pool or
// staged.
const RegionResumed RegionFlags = 1 << 0

// RegionUnpaged: a mapping of shared memory (KindShared) that the shim
// maps but does not page (its uffd refused to register it: a file opened
// read-only; or it is MAP_LOCKED). It never becomes a region: the agent
// releases the segment if it pages it (its evicted pages would read as
// holes there), and refuses it.
const RegionUnpaged RegionFlags = 1 << 1

func (*RegionAdd) Type() Type { return TypeRegionAdd }

func (m *RegionAdd) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeRegionAdd, seq, regionAddSize)
	b = le.AppendUint64(b, m.ID)
	b = le.AppendUint64(b, uint64(m.Range.Start))
	b = le.AppendUint64(b, m.Range.Len)
	b = le.AppendUint32(b, uint32(m.Kind))
	return le.AppendUint32(b, uint32(m.Flags))
}

func (m *RegionAdd) Decode(body []byte) error {
	if err := checkLen(TypeRegionAdd, body, regionAddSize); err != nil {
		return err
	}
	r := RegionAdd{
		ID:    le.Uint64(body),
		Range: userfaultfd.Range{Start: userfaultfd.Addr(le.Uint64(body[8:])), Len: le.Uint64(body[16:])},
		Kind:  Kind(le.Uint32(body[24:])),
		Flags: RegionFlags(le.Uint32(body[28:])),
	}
	if err := checkRange(TypeRegionAdd, r.Range); err != nil {
		return err
	}
	if r.Kind != KindHeap && r.Kind != KindMmap && r.Kind != KindShared {
		return fmt.Errorf("%w: REGION_ADD %v", ErrMalformed, r.Kind)
	}
	switch {
	case r.Flags&^(RegionResumed|RegionUnpaged) != 0:
		return fmt.Errorf("%w: REGION_ADD flags %#x", ErrMalformed, uint32(r.Flags))
	case r.Flags&RegionUnpaged != 0 && (r.Kind != KindShared || r.Flags&RegionResumed != 0):
		return fmt.Errorf("%w: REGION_ADD of an unpaged mapping that is not new shared memory", ErrMalformed)
	}
	*m = r
	return nil
}

// ResumeDone ends the re-announcement of a resuming process's regions
// (Regions of them); the agent answers ACK once it serves the process, or
// ERROR.
type ResumeDone struct {
	Regions uint32
}

func (*ResumeDone) Type() Type { return TypeResumeDone }

func (m *ResumeDone) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeResumeDone, seq, resumeDoneSize)
	b = le.AppendUint32(b, m.Regions)
	return le.AppendUint32(b, 0)
}

func (m *ResumeDone) Decode(body []byte) error {
	if err := checkLen(TypeResumeDone, body, resumeDoneSize); err != nil {
		return err
	}
	if err := reserved(TypeResumeDone, "reserved", le.Uint32(body[4:])); err != nil {
		return err
	}
	*m = ResumeDone{Regions: le.Uint32(body)}
	return nil
}

// RegionDel says that Range, part or all of region ID, is about to be
// unmapped (free, munmap, realloc that moves, MAP_FIXED over it). The
// shim unmaps only after the ACK; what remains of the region keeps its
// ID.
type RegionDel struct {
	ID    uint64
	Range userfaultfd.Range
}

func (*RegionDel) Type() Type { return TypeRegionDel }

func (m *RegionDel) Encode(b []byte, seq uint32) []byte {
	return appendRegionRange(b, TypeRegionDel, seq, m.ID, m.Range)
}

func (m *RegionDel) Decode(body []byte) error {
	return decodeRegionRange(TypeRegionDel, body, &m.ID, &m.Range)
}

// appendRegionRange encodes the body REGION_DEL and REGION_ZAP share.
func appendRegionRange(b []byte, t Type, seq uint32, id uint64, r userfaultfd.Range) []byte {
	b = appendHeader(b, t, seq, regionDelSize)
	b = le.AppendUint64(b, id)
	b = le.AppendUint64(b, uint64(r.Start))
	return le.AppendUint64(b, r.Len)
}

// decodeRegionRange decodes that body into id and r, which it leaves
// alone on an error.
func decodeRegionRange(t Type, body []byte, id *uint64, r *userfaultfd.Range) error {
	if err := checkLen(t, body, regionDelSize); err != nil {
		return err
	}
	rng := userfaultfd.Range{Start: userfaultfd.Addr(le.Uint64(body[8:])), Len: le.Uint64(body[16:])}
	if err := checkRange(t, rng); err != nil {
		return err
	}
	*id, *r = le.Uint64(body), rng
	return nil
}

// RegionZap says that Range, part or all of region ID, is being dropped by
// the program (MADV_DONTNEED, MADV_FREE; the shim calls madvise after the
// ACK): its pages read as zeros from now on, so the agent forgets what it
// holds for them. The shim asks the kernel for
// no REMOVE events (each blocks the madvising thread until the agent reads
// it, which made every eviction run a thread round trip): this message is
// how the agent learns of the program's own drops. Same layout as
// REGION_DEL.
type RegionZap struct {
	ID    uint64
	Range userfaultfd.Range
}

func (*RegionZap) Type() Type { return TypeRegionZap }

func (m *RegionZap) Encode(b []byte, seq uint32) []byte {
	return appendRegionRange(b, TypeRegionZap, seq, m.ID, m.Range)
}

func (m *RegionZap) Decode(body []byte) error {
	return decodeRegionRange(TypeRegionZap, body, &m.ID, &m.Range)
}

func checkRange(t Type, r userfaultfd.Range) error {
	if r.Len == 0 || !r.WellFormed() {
		return fmt.Errorf("%w: %v range %v", ErrMalformed, t, r)
	}
	return nil
}

// Ack answers a request (REGION_ADD, REGION_DEL) that succeeded.
type Ack struct {
	Seq uint32 // the request's
}

func (*Ack) Type() Type { return TypeAck }

func (m *Ack) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeAck, seq, ackSize)
	b = le.AppendUint32(b, m.Seq)
	return le.AppendUint32(b, 0)
}

func (m *Ack) Decode(body []byte) error {
	if err := checkLen(TypeAck, body, ackSize); err != nil {
		return err
	}
	if err := reserved(TypeAck, "reserved", le.Uint32(body[4:])); err != nil {
		return err
	}
	m.Seq = le.Uint32(body)
	return nil
}

// Error answers a request that failed (or a HELLO that is refused). It is
// an error: it wraps its errno, so errors.Is(err, unix.ENOMEM) works.
type Error struct {
	Seq   uint32     // the request's
	Errno unix.Errno // nonzero
	Text  string     // at most MaxErrorText bytes
}

func (*Error) Type() Type { return TypeError }

func (m *Error) Error() string {
	if m.Text == "" {
		return fmt.Sprintf("proto: peer refused request %d: %v", m.Seq, m.Errno)
	}
	return fmt.Sprintf("proto: peer refused request %d: %s: %v", m.Seq, m.Text, m.Errno)
}

func (m *Error) Unwrap() error { return m.Errno }

// Encode truncates Text to MaxErrorText bytes.
func (m *Error) Encode(b []byte, seq uint32) []byte {
	text := m.Text
	if len(text) > MaxErrorText {
		text = text[:MaxErrorText]
	}
	b = appendHeader(b, TypeError, seq, errorFixed+len(text))
	b = le.AppendUint32(b, m.Seq)
	b = le.AppendUint32(b, uint32(m.Errno))
	return append(b, text...)
}

func (m *Error) Decode(body []byte) error {
	if len(body) < errorFixed || len(body) > errorFixed+MaxErrorText {
		return fmt.Errorf("%w: ERROR body is %d bytes, want %d..%d", ErrMalformed, len(body), errorFixed, errorFixed+MaxErrorText)
	}
	e := le.Uint32(body[4:])
	if e == 0 {
		return fmt.Errorf("%w: ERROR with errno 0", ErrMalformed)
	}
	*m = Error{Seq: le.Uint32(body), Errno: unix.Errno(e), Text: string(body[errorFixed:])}
	return nil
}

// EvictPage names one victim: the page at Addr goes to staging slot Slot,
// or, with Slot NoSlot, is dropped without a copy.
type EvictPage struct {
	Addr userfaultfd.Addr
	Slot uint32
}

// Evict asks the shim's helper thread to copy each page into its staging
// slot (unless NoSlot) and then drop it (MADV_DONTNEED, one call per run
// of adjacent entries). The agent has write-protected the pages first.
// NoSlot entries let the agent drop clean pages (the pool has them) and
// join runs across pages that are not mapped (dropping them is a no-op),
// so that a batch costs few MADV_DONTNEED calls: each one raises a uffd
// REMOVE event that blocks the helper until the agent has read it.
type Evict struct {
	Batch uint64
	N     int // pages used in Pages, 1..MaxEvictBatch
	Pages [MaxEvictBatch]EvictPage
}

func (*Evict) Type() Type { return TypeEvict }

// Encode sends Pages[:N]; N must be within 1..MaxEvictBatch.
func (m *Evict) Encode(b []byte, seq uint32) []byte {
	n := min(max(m.N, 0), MaxEvictBatch)
	b = appendHeader(b, TypeEvict, seq, evictFixed+n*evictEntry)
	b = le.AppendUint64(b, m.Batch)
	b = le.AppendUint32(b, uint32(n))
	b = le.AppendUint32(b, 0)
	for _, p := range m.Pages[:n] {
		b = le.AppendUint64(b, uint64(p.Addr))
		b = le.AppendUint32(b, p.Slot)
		b = le.AppendUint32(b, 0)
	}
	return b
}

func (m *Evict) Decode(body []byte) error {
	if len(body) < evictFixed {
		return fmt.Errorf("%w: EVICT body is %d bytes, shorter than %d", ErrMalformed, len(body), evictFixed)
	}
	n := le.Uint32(body[8:])
	if n == 0 || n > MaxEvictBatch {
		return fmt.Errorf("%w: EVICT of %d pages (1..%d)", ErrMalformed, n, MaxEvictBatch)
	}
	if err := checkLen(TypeEvict, body, evictFixed+int(n)*evictEntry); err != nil {
		return err
	}
	if err := reserved(TypeEvict, "reserved", le.Uint32(body[12:])); err != nil {
		return err
	}
	for i := range int(n) {
		e := body[evictFixed+i*evictEntry:]
		if err := reserved(TypeEvict, "entry reserved", le.Uint32(e[12:])); err != nil {
			return err
		}
	}
	m.Batch = le.Uint64(body)
	m.N = int(n)
	for i := range m.N {
		e := body[evictFixed+i*evictEntry:]
		m.Pages[i] = EvictPage{Addr: userfaultfd.Addr(le.Uint64(e)), Slot: le.Uint32(e[8:])}
	}
	clear(m.Pages[m.N:])
	return nil
}

// Evicted answers an EVICT: the first Done pages were copied and dropped;
// if Done < N, Errno says why the next one failed.
type Evicted struct {
	Batch uint64
	Done  uint32
	Errno unix.Errno
}

func (*Evicted) Type() Type { return TypeEvicted }

func (m *Evicted) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeEvicted, seq, evictedSize)
	b = le.AppendUint64(b, m.Batch)
	b = le.AppendUint32(b, m.Done)
	return le.AppendUint32(b, uint32(m.Errno))
}

func (m *Evicted) Decode(body []byte) error {
	if err := checkLen(TypeEvicted, body, evictedSize); err != nil {
		return err
	}
	e := Evicted{Batch: le.Uint64(body), Done: le.Uint32(body[8:]), Errno: unix.Errno(le.Uint32(body[12:]))}
	if e.Done > MaxEvictBatch {
		return fmt.Errorf("%w: EVICTED says %d pages done (max %d)", ErrMalformed, e.Done, MaxEvictBatch)
	}
	*m = e
	return nil
}

// UFFDDevice asks the agent, before HELLO, for a descriptor of
// /dev/userfaultfd (ACK carries it as SCM_RIGHTS). A process that may not
// create a userfaultfd that also serves the kernel's own accesses to its
// memory (vm.unprivileged_userfaultfd is 0 and /dev/userfaultfd is root's)
// makes one with USERFAULTFD_IOC_NEW on the lent descriptor: the new uffd
// belongs to the caller's address space, so the agent lends no access to
// anyone else's. The agent lends it only to the uids it serves. Empty body.
type UFFDDevice struct{}

func (*UFFDDevice) Type() Type { return TypeUFFDDevice }

func (m *UFFDDevice) Encode(b []byte, seq uint32) []byte {
	return appendHeader(b, TypeUFFDDevice, seq, 0)
}

func (m *UFFDDevice) Decode(body []byte) error { return checkLen(TypeUFFDDevice, body, 0) }

// ForkPrepare: the client is about to fork(2) and its uffd has no FORK
// events, so the child's registered ranges will be plain anonymous memory
// with the evicted pages missing. The agent stops evicting the client's
// pages until FORK_DONE, copies every page the pool holds for it to slabs
// of the child's own, and ACKs; the child then registers a uffd of its own
// and says HELLO with it and Serial. The copy is made before fork(2) so
// that the parent cannot write a page back over what the child inherits.
type ForkPrepare struct {
	Serial uint64 // the client's forks with regions, counted from 1
}

func (*ForkPrepare) Type() Type { return TypeForkPrepare }

func (m *ForkPrepare) Encode(b []byte, seq uint32) []byte {
	return appendFork(b, TypeForkPrepare, seq, m.Serial, 0)
}

func (m *ForkPrepare) Decode(body []byte) error {
	serial, pid, err := decodeFork(TypeForkPrepare, body)
	if err == nil && pid != 0 {
		err = fmt.Errorf("%w: FORK_PREPARE with pid %d, must be 0", ErrMalformed, pid)
	}
	if err != nil {
		return err
	}
	m.Serial = serial
	return nil
}

// appendFork encodes the body FORK_PREPARE and FORK_DONE share: serial
// u64, pid i32, reserved u32.
func appendFork(b []byte, t Type, seq uint32, serial uint64, pid int32) []byte {
	b = appendHeader(b, t, seq, forkSize)
	b = le.AppendUint64(b, serial)
	b = le.AppendUint32(b, uint32(pid))
	return le.AppendUint32(b, 0)
}

// decodeFork decodes that body; the serial is never 0.
func decodeFork(t Type, body []byte) (serial uint64, pid int32, err error) {
	if err := checkLen(t, body, forkSize); err != nil {
		return 0, 0, err
	}
	if err := reserved(t, "reserved", le.Uint32(body[12:])); err != nil {
		return 0, 0, err
	}
	if le.Uint64(body) == 0 {
		return 0, 0, fmt.Errorf("%w: %v of fork serial 0", ErrMalformed, t)
	}
	return le.Uint64(body), int32(le.Uint32(body[8:])), nil
}

// ForkDone: the fork FORK_PREPARE announced returned in the parent, with
// the child's pid, or a negative errno if it failed (the agent then frees
// the child's copy), or 0 when the parent does not know: the fork was made
// inside the C library (glibc's daemon()) and seen by an atfork parent
// handler, which is told neither. Evictions of the parent resume.
type ForkDone struct {
	Serial uint64
	PID    int32 // the child, -errno, or 0: not known
}

func (*ForkDone) Type() Type { return TypeForkDone }

func (m *ForkDone) Encode(b []byte, seq uint32) []byte {
	return appendFork(b, TypeForkDone, seq, m.Serial, m.PID)
}

func (m *ForkDone) Decode(body []byte) error {
	serial, pid, err := decodeFork(TypeForkDone, body)
	if err != nil {
		return err
	}
	*m = ForkDone{Serial: serial, PID: pid}
	return nil
}

var (
	_ Message = (*UFFDDevice)(nil)
	_ Message = (*ForkPrepare)(nil)
	_ Message = (*ForkDone)(nil)
	_ Message = (*Hello)(nil)
	_ Message = (*Welcome)(nil)
	_ Message = (*RegionAdd)(nil)
	_ Message = (*RegionDel)(nil)
	_ Message = (*RegionZap)(nil)
	_ Message = (*Ack)(nil)
	_ Message = (*Error)(nil)
	_ Message = (*Evict)(nil)
	_ Message = (*Evicted)(nil)
)

// HandoffMaxFDs is the most descriptors one HANDOFF names.
const HandoffMaxFDs = 16

// HandoffFlags are bits of Handoff.Flags.
type HandoffFlags uint32

// HandoffExec: PID is about to exec(2); every descriptor it keeps open
// across the exec (not close-on-exec) leaves with it, besides those named.
const HandoffExec HandoffFlags = 1 << 0

// HandoffIO: PID is about to read or write the file through the named
// descriptors (read(2), write(2)): one it mapped shared memory through,
// opened before the segment was paged, whose reads the guard does not see.
const HandoffIO HandoffFlags = 1 << 1

// Handoff says that descriptors of process PID are about to leave the
// agent's sight: a new program that may have no shim (exec), or a socket
// (SCM_RIGHTS) to a process that may be outside the agent. Such a process
// could map a shared memory segment the agent pages without ever opening
// it, which the agent would not see (docs/pager.md, "Shared memory"). The
// agent releases every paged segment they reach, then answers ACK; or
// ERROR (EPERM) if one holds pages the pool lost, which would read as
// zeros there. PID is the sender or a child of vfork about to exec on its
// memory.
type Handoff struct {
	PID   int32
	Flags HandoffFlags
	N     uint32               // FDs[:N] are named
	FDs   [HandoffMaxFDs]int32 // descriptors of PID; the rest 0
}

func (*Handoff) Type() Type { return TypeHandoff }

func (m *Handoff) Encode(b []byte, seq uint32) []byte {
	b = appendHeader(b, TypeHandoff, seq, handoffSize)
	b = le.AppendUint32(b, uint32(m.PID))
	b = le.AppendUint32(b, uint32(m.Flags))
	b = le.AppendUint32(b, m.N)
	b = le.AppendUint32(b, 0)
	for _, fd := range m.FDs {
		b = le.AppendUint32(b, uint32(fd))
	}
	return b
}

func (m *Handoff) Decode(body []byte) error {
	if err := checkLen(TypeHandoff, body, handoffSize); err != nil {
		return err
	}
	if err := reserved(TypeHandoff, "reserved", le.Uint32(body[12:])); err != nil {
		return err
	}
	h := Handoff{PID: int32(le.Uint32(body)), Flags: HandoffFlags(le.Uint32(body[4:])), N: le.Uint32(body[8:])}
	switch {
	case h.PID <= 0:
		return fmt.Errorf("%w: HANDOFF of pid %d", ErrMalformed, h.PID)
	case h.Flags&^(HandoffExec|HandoffIO) != 0, h.Flags == HandoffExec|HandoffIO:
		return fmt.Errorf("%w: HANDOFF flags %#x", ErrMalformed, uint32(h.Flags))
	case h.N > HandoffMaxFDs:
		return fmt.Errorf("%w: HANDOFF of %d descriptors, at most %d", ErrMalformed, h.N, HandoffMaxFDs)
	}
	for i := range h.FDs {
		h.FDs[i] = int32(le.Uint32(body[16+4*i:]))
		switch {
		case uint32(i) < h.N && h.FDs[i] < 0:
			return fmt.Errorf("%w: HANDOFF of descriptor %d", ErrMalformed, h.FDs[i])
		case uint32(i) >= h.N && h.FDs[i] != 0:
			return fmt.Errorf("%w: HANDOFF descriptor %d past its count is %d, must be 0", ErrMalformed, i, h.FDs[i])
		}
	}
	*m = h
	return nil
}
