package rdma

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"rmem/rdma/internal/atomicmem"
)

// DomainOptions configure a Domain. The zero value gives the defaults.
type DomainOptions struct {
	// RevokeGrace is how long Revoke lets in-flight server-executed ops on
	// the key finish before aborting the connections that carry them
	// (default 100ms).
	RevokeGrace time.Duration
	// RememberRevoked is how many revoked keys keep answering
	// StatusRevokedKey (older ones answer StatusUnknownKey); default 65536.
	RememberRevoked int
}

// Domain is the server side's protection domain: the registered regions and
// the key table, shared by every listener (tcp, shm, ...) that serves them.
type Domain struct {
	grace     time.Duration
	rememberN int
	// live is a read-only snapshot of keys, replaced (copy on write) on
	// every change, so that the per-op lookup takes no lock.
	live atomic.Pointer[map[Key]*keyEntry]

	mu      sync.RWMutex
	regions map[*Region]struct{}
	keys    map[Key]*keyEntry
	revoked map[Key]struct{}
	// unfinished holds keys whose Revoke has not completed yet.
	unfinished map[Key]*keyEntry
	revRing    []Key // FIFO of revoked keys, bounds revoked
	revNext    int
	sessions   map[*Session]struct{}
	retired    Stats // counters of closed sessions; guarded by mu
}

// publishLocked replaces the lock-free snapshot of the key table: O(keys)
// per IssueKey and Revoke, which are rare (one per slab lease).
// Preconditions: d.mu must be locked.
func (d *Domain) publishLocked() {
	m := make(map[Key]*keyEntry, len(d.keys))
	for k, e := range d.keys {
		m[k] = e
	}
	d.live.Store(&m)
}

// keyEntry is one issued key.
type keyEntry struct {
	key    Key
	region *Region
	mem    []byte // region.mem[base : base+len]
	base   uint64 // offset of the range in the region (and in its memfd)
	access Access

	revoked  atomic.Bool
	inflight atomic.Int64 // server-executed ops between Begin and End

	mappers map[*Session]struct{} // guarded by Domain.mu; sessions that mapped the key (shm)
}

// acquire registers one in-flight op; it fails once the key is revoked.
// Together with Revoke (store revoked, then wait for inflight == 0) this is
// a Dekker handshake: either Revoke sees the op, or the op sees the revoke.
func (e *keyEntry) acquire() bool {
	e.inflight.Add(1)
	if e.revoked.Load() {
		e.inflight.Add(-1)
		return false
	}
	return true
}

// NewDomain returns an empty domain.
func NewDomain(opts DomainOptions) *Domain {
	if opts.RevokeGrace <= 0 {
		opts.RevokeGrace = 100 * time.Millisecond
	}
	if opts.RememberRevoked <= 0 {
		opts.RememberRevoked = 1 << 16
	}
	d := &Domain{
		grace:      opts.RevokeGrace,
		rememberN:  opts.RememberRevoked,
		regions:    map[*Region]struct{}{},
		keys:       map[Key]*keyEntry{},
		revoked:    map[Key]struct{}{},
		unfinished: map[Key]*keyEntry{},
		sessions:   map[*Session]struct{}{},
	}
	// The snapshot exists from the start: a keyed request reaching a
	// domain that never issued a key (a fresh or restarted server) must
	// get StatusUnknownKey, not a nil map dereference.
	d.live.Store(&map[Key]*keyEntry{})
	return d
}

// Register adds r to the domain so keys can be issued for it.
func (d *Domain) Register(r *Region) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("rdma: register: %w", ErrClosed)
	}
	if r.domain != nil {
		return ErrRegistered
	}
	d.mu.Lock()
	d.regions[r] = struct{}{}
	d.mu.Unlock()
	r.domain = d
	return nil
}

// Deregister revokes every key of r (as Revoke does) and removes r.
func (d *Domain) Deregister(ctx context.Context, r *Region) error {
	d.mu.RLock()
	_, ok := d.regions[r]
	var ks []Key
	for k, e := range d.keys {
		if e.region == r {
			ks = append(ks, k)
		}
	}
	for k, e := range d.unfinished {
		if e.region == r {
			ks = append(ks, k)
		}
	}
	d.mu.RUnlock()
	if !ok {
		return ErrNotRegistered
	}
	for _, k := range ks {
		if err := d.Revoke(ctx, k); err != nil {
			return err
		}
	}
	d.mu.Lock()
	delete(d.regions, r)
	d.mu.Unlock()
	r.mu.Lock()
	r.domain = nil
	r.mu.Unlock()
	return nil
}

// IssueKey returns a new key for [off, off+length) of r with the given
// access. Work requests with the key address that range from offset 0.
func (d *Domain) IssueKey(r *Region, off, length uint64, acc Access) (Key, error) {
	if !acc.Valid() {
		return Key{}, fmt.Errorf("rdma: issue key: invalid access %d", acc)
	}
	if length == 0 || off > r.Len() || length > r.Len()-off {
		return Key{}, fmt.Errorf("rdma: issue key: range [%d, +%d) outside region of %d bytes: %w",
			off, length, r.Len(), ErrOutOfBounds)
	}
	k, err := NewKey()
	if err != nil {
		return Key{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.regions[r]; !ok {
		return Key{}, ErrNotRegistered
	}
	d.keys[k] = &keyEntry{
		key: k, region: r, mem: r.mem[off : off+length : off+length],
		base: off, access: acc,
	}
	d.publishLocked()
	return k, nil
}

// Revoke withdraws k. When it returns nil, no op with k is executing and
// none can start, in any provider of the domain, so the caller may zero and
// reuse the memory:
//   - ops executed by the server (tcp, in-memory) that are in flight get
//     RevokeGrace to finish; then the connections carrying them are aborted
//     (their clients see a transport failure) and Revoke waits for the
//     aborted ops to unwind;
//   - clients that mapped the key (shm) are fenced: Revoke waits until each
//     has acknowledged, through shared memory, that it is not inside an op
//     with the key, or its process has exited.
//
// If ctx ends first, Revoke returns an error wrapping ErrRevokeIncomplete:
// the key is revoked for new ops but an op may still be running; do not
// reuse the memory, and call Revoke again later: it resumes waiting, and
// returns nil once the revocation is complete. Revoking a key whose
// revocation completed returns nil; an unknown key returns ErrUnknownKey.
func (d *Domain) Revoke(ctx context.Context, k Key) error {
	d.mu.Lock()
	e, ok := d.keys[k]
	switch {
	case ok:
		delete(d.keys, k)
		d.publishLocked()
		d.rememberRevokedLocked(k)
		d.unfinished[k] = e
	case d.unfinished[k] != nil:
		e = d.unfinished[k] // an earlier Revoke gave up: wait again
	default:
		_, was := d.revoked[k]
		d.mu.Unlock()
		if was {
			return nil
		}
		return fmt.Errorf("rdma: revoke %s: %w", k, ErrUnknownKey)
	}
	mappers := make([]*Session, 0, len(e.mappers))
	for s := range e.mappers {
		mappers = append(mappers, s)
	}
	d.mu.Unlock()

	e.revoked.Store(true)
	if !waitZero(ctx, &e.inflight, d.grace) {
		if ctx.Err() != nil {
			return fmt.Errorf("rdma: revoke %s: %w: %w", k, ErrRevokeIncomplete, ctx.Err())
		}
		d.abortHolders(e)
		if !waitZero(ctx, &e.inflight, 0) {
			return fmt.Errorf("rdma: revoke %s: %w: %w", k, ErrRevokeIncomplete, ctx.Err())
		}
	}
	for _, s := range mappers {
		if s.hooks.Fence != nil {
			if err := s.hooks.Fence(ctx, k); err != nil {
				return fmt.Errorf("rdma: revoke %s: %w: %w", k, ErrRevokeIncomplete, err)
			}
		}
		d.mu.Lock()
		delete(e.mappers, s)
		d.mu.Unlock()
	}
	d.mu.Lock()
	delete(d.unfinished, k)
	d.mu.Unlock()
	return nil
}

// rememberRevokedLocked records k as revoked, forgetting the oldest one
// beyond RememberRevoked. Preconditions: d.mu must be locked.
func (d *Domain) rememberRevokedLocked(k Key) {
	if len(d.revRing) < d.rememberN {
		d.revRing = append(d.revRing, k)
	} else {
		delete(d.revoked, d.revRing[d.revNext])
		d.revRing[d.revNext] = k
		d.revNext = (d.revNext + 1) % d.rememberN
	}
	d.revoked[k] = struct{}{}
}

// waitZero waits until *n is 0, for at most limit (0: until ctx ends).
func waitZero(ctx context.Context, n *atomic.Int64, limit time.Duration) bool {
	var deadline time.Time
	if limit > 0 {
		deadline = time.Now().Add(limit)
	}
	sleep := time.Microsecond
	for n.Load() != 0 {
		if ctx.Err() != nil || (limit > 0 && time.Now().After(deadline)) {
			return false
		}
		time.Sleep(sleep)
		if sleep < time.Millisecond {
			sleep *= 2
		}
	}
	return true
}

func (d *Domain) abortHolders(e *keyEntry) {
	d.mu.RLock()
	var victims []*Session
	for s := range d.sessions {
		if s.holds(e) {
			victims = append(victims, s)
		}
	}
	d.mu.RUnlock()
	for _, s := range victims {
		if s.hooks.Abort != nil {
			s.hooks.Abort()
		}
	}
}

// Stats are cumulative counters of server-executed ops (tcp, in-memory).
// Ops of shm clients run in the client and are not counted here.
type Stats struct {
	Reads, Writes, CompareSwaps, FetchAdds uint64
	BytesRead, BytesWritten                uint64 // payload bytes served / received
	Errors                                 uint64 // requests completed with an error status
	Keys                                   int    // live keys
}

// Stats returns a snapshot of the counters.
func (d *Domain) Stats() Stats {
	d.mu.RLock()
	defer d.mu.RUnlock()
	st := d.retired
	for s := range d.sessions {
		s.addStats(&st)
	}
	st.Keys = len(d.keys)
	return st
}

// SessionHooks let the Domain act on a provider's connection during Revoke.
type SessionHooks struct {
	// Abort makes the connection's blocked I/O return (close its socket),
	// so ops it holds end promptly. Called from Revoke's goroutine.
	Abort func()
	// Fence is called for a key the session mapped (Session.Map) when the
	// key is revoked; it returns once the client can no longer touch the
	// key's memory, or with ctx's error.
	Fence func(ctx context.Context, k Key) error
}

// maxHeld bounds the ops one session holds at once (Begin without End).
const maxHeld = 256

// Session is one client connection's view of a Domain. Providers create one
// per accepted connection; the memory server's code never uses it.
// A Session is used by one goroutine at a time (the connection's); the
// Domain reads its held ops and counters concurrently, through atomics.
type Session struct {
	d     *Domain
	hooks SessionHooks

	held   [maxHeld]atomic.Pointer[keyEntry] // ops between Begin and End
	nheld  int                               // owner only: held[:nheld] may be set
	closed atomic.Bool

	ops              [OpFetchAdd + 1]atomic.Uint64
	bytesRd, bytesWr atomic.Uint64
	errs             atomic.Uint64
	mapped           map[*keyEntry]struct{} // guarded by Domain.mu
}

// NewSession registers a connection's session.
func (d *Domain) NewSession(h SessionHooks) *Session {
	s := &Session{d: d, hooks: h}
	d.mu.Lock()
	d.sessions[s] = struct{}{}
	d.mu.Unlock()
	return s
}

// Close unregisters the session and forgets its mappings. Holds must have
// been ended. It is safe to call twice.
func (s *Session) Close() {
	s.closed.Store(true)
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, ok := s.d.sessions[s]; !ok {
		return
	}
	delete(s.d.sessions, s)
	for e := range s.mapped {
		delete(e.mappers, s)
	}
	s.mapped = nil
	s.addStats(&s.d.retired)
}

func (s *Session) addStats(st *Stats) {
	st.Reads += s.ops[OpRead].Load()
	st.Writes += s.ops[OpWrite].Load()
	st.CompareSwaps += s.ops[OpCompareSwap].Load()
	st.FetchAdds += s.ops[OpFetchAdd].Load()
	st.BytesRead += s.bytesRd.Load()
	st.BytesWritten += s.bytesWr.Load()
	st.Errors += s.errs.Load()
}

func (s *Session) holds(e *keyEntry) bool {
	for i := range s.held {
		if s.held[i].Load() == e {
			return true
		}
	}
	return false
}

// Hold is an op in progress on registered memory, from Begin to End.
type Hold struct {
	e *keyEntry
	// Mem is the op's bytes in the region: [off, off+n) of the key's range.
	Mem []byte
}

// lookup finds k's entry or the status to answer.
func (d *Domain) lookup(k Key) (*keyEntry, Status) {
	if e := (*d.live.Load())[k]; e != nil {
		return e, StatusOK
	}
	d.mu.RLock()
	_, was := d.revoked[k]
	if !was {
		_, was = d.unfinished[k]
	}
	d.mu.RUnlock()
	if was {
		return nil, StatusRevokedKey
	}
	return nil, StatusUnknownKey
}

// Begin checks an op of n bytes at off with key k and, if it may run, pins
// the key against revocation until End. n is AtomicSize for atomics.
// It does not allocate.
func (s *Session) Begin(k Key, op Opcode, off uint64, n int) (Hold, Status) {
	h, st := s.begin(k, op, off, n)
	if st != StatusOK {
		s.errs.Add(1)
		return Hold{}, st
	}
	s.ops[op].Add(1)
	switch op {
	case OpRead:
		s.bytesRd.Add(uint64(n))
	case OpWrite:
		s.bytesWr.Add(uint64(n))
	}
	return h, StatusOK
}

func (s *Session) begin(k Key, op Opcode, off uint64, n int) (Hold, Status) {
	if !op.Valid() || n < 0 || n > MaxTransfer || (op.IsAtomic() && n != AtomicSize) {
		return Hold{}, StatusInvalid
	}
	e, st := s.d.lookup(k)
	if st != StatusOK {
		return Hold{}, st
	}
	if !e.access.Allows(op) {
		return Hold{}, StatusPermission
	}
	size := uint64(len(e.mem))
	if off > size || uint64(n) > size-off {
		return Hold{}, StatusOutOfBounds
	}
	mem := e.mem[off : off+uint64(n) : off+uint64(n)]
	if op.IsAtomic() && !atomicmem.Aligned(mem) {
		return Hold{}, StatusMisaligned
	}
	if s.nheld == maxHeld || s.closed.Load() {
		return Hold{}, StatusInvalid
	}
	// Publish the hold before acquiring, so that Revoke's abortHolders,
	// which runs after it saw inflight != 0, finds it.
	s.held[s.nheld].Store(e)
	s.nheld++
	if !e.acquire() {
		s.unhold(e)
		return Hold{}, StatusRevokedKey
	}
	return Hold{e: e, Mem: mem}, StatusOK
}

// End finishes an op begun with Begin.
func (s *Session) End(h Hold) {
	if h.e == nil {
		return
	}
	h.e.inflight.Add(-1)
	s.unhold(h.e)
}

func (s *Session) unhold(e *keyEntry) {
	for i := s.nheld - 1; i >= 0; i-- {
		if s.held[i].Load() == e {
			s.nheld--
			s.held[i].Store(s.held[s.nheld].Load())
			s.held[s.nheld].Store(nil)
			return
		}
	}
}

// Mapping describes a key's range in its region's memfd, for providers that
// let the client map the memory (shm).
type Mapping struct {
	Fd     int    // the region's memfd (owned by the region: dup before sending if needed)
	Offset uint64 // start of the key's range in the memfd
	Len    uint64
	Access Access
}

// Map checks k and registers the session as a mapper of it: on Revoke the
// Domain calls the session's Fence hook for k.
func (s *Session) Map(k Key) (Mapping, Status) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	e, ok := s.d.keys[k]
	if !ok {
		if _, was := s.d.revoked[k]; was {
			return Mapping{}, StatusRevokedKey
		}
		return Mapping{}, StatusUnknownKey
	}
	if e.region.fd < 0 {
		return Mapping{}, StatusPermission
	}
	if _, live := s.d.sessions[s]; !live {
		return Mapping{}, StatusInvalid
	}
	if e.mappers == nil {
		e.mappers = map[*Session]struct{}{}
	}
	e.mappers[s] = struct{}{}
	if s.mapped == nil {
		s.mapped = map[*keyEntry]struct{}{}
	}
	s.mapped[e] = struct{}{}
	return Mapping{Fd: e.region.fd, Offset: e.base, Len: uint64(len(e.mem)), Access: e.access}, StatusOK
}
