package slabio

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"rmem/pager/remote"
	"rmem/rdma"
)

var _ remote.PageIO = (*IO)(nil)

type connKey struct{ network, addr string }

type peer struct {
	c       rdma.Conn
	n       int  // requests posted in this round
	active  bool // in IO.active this round
	dialErr bool // dial failed this call: do not retry until the next call
	// downUntil: the server missed an op deadline; until then it is
	// skipped (its replicas are tried last, as unavailable).
	downUntil time.Time
}

// Op deadlines. A memory server that accepts requests and never answers
// (stopped, or cut off without a reset) would otherwise stall the fault
// loop that waits for it forever.
const (
	// DefaultOpTimeout bounds one call's wait for a server (a batch of
	// READs or WRITEs, and the dial before it): past it the server's
	// ops fail over to the next replica.
	DefaultOpTimeout = 2 * time.Second
	// peerDownFor is how long a server that missed a deadline is
	// skipped before it is tried again.
	peerDownFor = 5 * time.Second
)

// opCtx is a caller's ctx with the op deadline, kept in the IO so that a
// call allocates nothing (context.WithTimeout would, per call).
type opCtx struct {
	context.Context
	dl time.Time
}

func (c *opCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.dl) {
		return d, true
	}
	return c.dl, true
}

func (c *opCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// begin returns ctx with the op deadline from now (for one round of
// posts and waits).
func (io *IO) begin(ctx context.Context) *opCtx {
	io.octx = opCtx{ctx, time.Now().Add(io.opTimeout)}
	return &io.octx
}

// SetOpTimeout changes the op deadline (DefaultOpTimeout) of later calls.
func (io *IO) SetOpTimeout(d time.Duration) { io.opTimeout = d }

// Why an op is still failing, to choose between ErrLost and ErrUnavailable.
const (
	whyLost uint8 = 1 << iota
	whyUnavailable
	whyCorrupt // a copy read failed its checksum
)

// Marks of a posted WRITE (writeReq.marks).
const (
	wrFailed  uint8 = 1 << iota // the replica missed it
	wrFilling                   // the replica is Filling (Migrate)
)

// readOp is where a READ of one op stands.
type readOp struct {
	next uint8 // the replica to try next
	why  uint8 // why the replicas tried so far failed
	via  *peer // the connection of the request posted this round (nil: none)
	// srv is the server of that replica, named at post time: the table
	// may change (Migrate) before the completion is classified.
	srv  string
	sums []atomic.Uint64 // the slab's checksums
	// bad: a copy read failed its checksum; the good one found after it
	// is written back (repair).
	bad bool
}

// writeOp is what the WRITEs of one op did.
type writeOp struct {
	ok   uint8 // replicas written (a Filling one does not count)
	why  uint8
	sums []atomic.Uint64 // the slab's checksums
	file *sumFile
}

// writeReq is one posted WRITE: an op's replica.
type writeReq struct {
	op    int32 // index of its op in the chunk
	marks uint8 // wrFailed, wrFilling
	via   *peer
	srv   string // as readOp.srv
}

// IO is a PageIO over a Table: its own connection per replica address and
// preallocated work requests, for one goroutine.
type IO struct {
	t     *Table
	dial  rdma.DialOptions
	depth int
	peers map[connKey]*peer

	active []*peer
	wrs    []rdma.WorkRequest
	cqes   []rdma.Completion
	reads  []readOp   // per op of the current READ chunk
	writes []writeOp  // per op of the current WRITE chunk
	reqs   []writeReq // per posted WRITE of the current chunk
	pend   []int32    // READ: the ops still to read, this round and the next
	more   []int32
	// fix: ops whose good copy came after a bad one (written back after
	// the chunk); split: the pages of an op read again one by one.
	fix    []remote.PageOp
	split  []remote.PageOp
	noFix  bool   // Migrate's copy: it holds copyMu, which Write takes
	sumBuf []byte // sums encoded for their file
	// Buffers registered with every connection that can (RegisterLocal).
	locals    [][]byte
	octx      opCtx
	opTimeout time.Duration
	ec        ecIO // erasure-coded slabs' scratch (ec.go)
}

// NewIO returns an IO over t. Connections are dialled on first use, with
// ThreadWait: an IO belongs to one goroutine, typically a fault loop
// locked to its OS thread.
func (t *Table) NewIO() *IO {
	d := t.dial.QueueDepth()
	dial := t.dial
	dial.ThreadWait = true
	return &IO{
		t: t, dial: dial, depth: d, peers: map[connKey]*peer{},
		active: make([]*peer, 0, 16),
		wrs:    make([]rdma.WorkRequest, 2*d), cqes: make([]rdma.Completion, d),
		reads: make([]readOp, d), writes: make([]writeOp, d), reqs: make([]writeReq, d),
		pend: make([]int32, 0, d), more: make([]int32, 0, d),
		opTimeout: DefaultOpTimeout,
	}
}

// Close closes the IO's connections.
func (io *IO) Close() error {
	for k, p := range io.peers {
		if p.c != nil {
			p.c.Close()
		}
		delete(io.peers, k)
	}
	return nil
}

// peer returns the connection to r, dialling it if needed, or nil.
func (io *IO) peer(ctx context.Context, r *Replica) *peer {
	k := connKey{r.Network, r.Addr}
	p := io.peers[k]
	if p == nil {
		p = &peer{}
		io.peers[k] = p
	}
	if p.c == nil && !p.dialErr && time.Now().Before(p.downUntil) {
		return nil
	}
	if p.c == nil && !p.dialErr {
		c, err := rdma.Dial(ctx, r.Network, r.Addr, io.dial)
		if err != nil {
			p.dialErr = true
			return nil
		}
		p.c = c
		for _, mem := range io.locals {
			io.register(p, mem)
		}
	}
	if p.c == nil {
		return nil
	}
	if !p.active {
		p.active, p.n = true, 0
		io.active = append(io.active, p)
	}
	return p
}

// stall drops the connection of a server that missed a deadline and skips
// it for peerDownFor.
func (p *peer) stall() {
	p.drop()
	p.downUntil = time.Now().Add(peerDownFor)
}

// drop closes a failed connection; the next call redials.
func (p *peer) drop() {
	if p.c != nil {
		p.c.Close()
		p.c = nil
	}
}

func (io *IO) endCall() {
	for _, p := range io.peers {
		p.dialErr = false
	}
}

func (io *IO) endRound() {
	for _, p := range io.active {
		p.active, p.n = false, 0
	}
	io.active = io.active[:0]
}

// Read implements remote.PageIO.
func (io *IO) Read(ctx context.Context, ops []remote.PageOp) error {
	if io.t.hasGroups.Load() {
		if io.partial(ops) {
			return io.ecReadPartial(ctx, ops)
		}
		return io.ecRead(ctx, ops)
	}
	return io.readReplicas(ctx, ops)
}

// readReplicas reads ops of slabs with replicas (a group's shards are).
func (io *IO) readReplicas(ctx context.Context, ops []remote.PageOp) error {
	defer io.endCall()
	for i := range ops {
		ops[i].Corrupt = 0
	}
	for len(ops) > 0 {
		n := min(len(ops), io.depth)
		err := io.readChunk(ctx, ops[:n])
		if err == nil {
			err = io.afterChunk(ctx, ops[:n])
		}
		if err != nil {
			return io.failAll(ops, err)
		}
		ops = ops[n:]
	}
	return nil
}

// afterChunk writes back the good copies found after bad ones (io.fix),
// and reads the ops of several pages that found no good copy again page by
// page, so that every page with a good copy is in their Buf.
func (io *IO) afterChunk(ctx context.Context, ops []remote.PageOp) error {
	if len(io.fix) > 0 {
		if err := io.writeReplicas(ctx, io.fix); err != nil {
			return err
		}
		for _, f := range io.fix {
			if f.Err == nil {
				io.t.repaired.Add(uint64(len(f.Buf) / pageSize))
			}
		}
		io.fix = io.fix[:0]
	}
	for i := range ops {
		op := &ops[i]
		if !errors.Is(op.Err, remote.ErrCorrupt) || len(op.Buf) <= pageSize || len(op.Buf)%pageSize != 0 {
			continue
		}
		io.split = io.split[:0]
		for j := 0; j < len(op.Buf); j += pageSize {
			io.split = append(io.split, remote.PageOp{Slab: op.Slab, Off: op.Off + uint64(j), Buf: op.Buf[j : j+pageSize]})
		}
		for k := 0; k < len(io.split); k += io.depth {
			part := io.split[k:min(k+io.depth, len(io.split))]
			err := io.readChunk(ctx, part)
			if err == nil {
				err = io.afterChunk(ctx, part) // single pages: writes back only
			}
			if err != nil {
				return err
			}
		}
		op.Err = nil
		for _, p := range io.split {
			op.Corrupt += p.Corrupt
			if p.Err != nil && (op.Err == nil || errors.Is(p.Err, remote.ErrCorrupt)) {
				op.Err = p.Err
			}
		}
	}
	return nil
}

func (io *IO) readChunk(ctx context.Context, ops []remote.PageOp) error {
	io.pend = io.pend[:0]
	for i := range ops {
		ops[i].Err = nil
		io.reads[i] = readOp{}
		io.pend = append(io.pend, int32(i))
	}
	parent := ctx
	for round := 0; len(io.pend) > 0; round++ {
		ctx := io.begin(parent) // each round waits at most the op deadline
		// Choose a replica per pending op.
		for _, i := range io.pend {
			op, ro := &ops[i], &io.reads[i]
			ro.via = nil
			e, ok := io.t.entry(op.Slab)
			if !ok {
				op.Err = remote.ErrUnknownSlab
				continue
			}
			reps := e.reps
			ro.sums = e.sums
			for int(ro.next) < len(reps) {
				r := &reps[ro.next]
				switch r.State {
				case Lost:
					ro.why |= whyLost
				case Healthy:
					if p := io.peer(ctx, r); p != nil {
						ro.via, ro.srv = p, r.Server
						io.wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: r.Key, Offset: op.Off, Local: op.Buf}
					} else {
						ro.why |= whyUnavailable
					}
				}
				ro.next++
				if ro.via != nil {
					break
				}
			}
			if ro.via == nil {
				io.fail(op, ro.why)
			} else if round > 0 {
				io.t.failovers.Add(1)
			}
		}
		// Post per connection, then collect.
		io.more = io.more[:0]
		for _, p := range io.active {
			k := 0
			for _, i := range io.pend {
				if io.reads[i].via == p {
					io.cqes[k].ID = uint64(i) // reuse cqes as an index list
					k++
				}
			}
			if err := io.postGather(p, k); err != nil {
				for j := 0; j < k; j++ {
					i := int32(io.cqes[j].ID)
					io.reads[i].via = nil
					io.reads[i].why |= whyUnavailable
					io.more = append(io.more, i)
				}
				p.drop()
				continue
			}
			p.n = k
		}
		for _, p := range io.active {
			err := io.collect(ctx, p, func(c *rdma.Completion) {
				i := int32(c.ID)
				op, ro := &ops[i], &io.reads[i]
				if c.Status == rdma.StatusOK {
					if n, at := badPages(ro.sums, op.Off, op.Buf); n > 0 {
						// A wrong copy: the next replica is tried, as
						// after an error.
						op.Corrupt += uint32(n)
						io.t.reportCorrupt(op.Slab, ro.srv, at, n)
						ro.why |= whyCorrupt
						ro.bad = true
						io.more = append(io.more, i)
						return
					}
					io.t.reads.Add(1)
					if ro.bad && !io.noFix {
						io.fix = append(io.fix, remote.PageOp{Slab: op.Slab, Off: op.Off, Buf: op.Buf})
					}
					return
				}
				io.classify(op.Slab, io.reads[i].srv, c.Status, p, &io.reads[i].why)
				io.more = append(io.more, i)
			})
			if err != nil {
				io.endRound()
				return err
			}
			// A stalled server left its last p.n READs (posted in pend
			// order, completed in order) unfinished: they move to the
			// next replica.
			for j := len(io.pend) - 1; j >= 0 && p.n > 0; j-- {
				if i := io.pend[j]; io.reads[i].via == p {
					io.reads[i].why |= whyUnavailable
					io.more = append(io.more, i)
					p.n--
				}
			}
		}
		io.endRound()
		io.pend, io.more = io.more, io.pend
	}
	return nil
}

// postGather posts, as one batch, the READs of the k ops whose indexes are
// in cqes[:k] (their WRs sit at wrs[i]), copied together into the scratch
// half of wrs. Providers copy WRs at Post, so the scratch is reusable.
func (io *IO) postGather(p *peer, k int) error {
	buf := io.scratch(k)
	for j := 0; j < k; j++ {
		buf[j] = io.wrs[io.cqes[j].ID]
	}
	return p.c.Post(buf)
}

// scratch returns k WorkRequests after the per-op ones (wrs has 2×depth).
func (io *IO) scratch(k int) []rdma.WorkRequest {
	return io.wrs[io.depth : io.depth+k : 2*io.depth]
}

// collect waits for p's n completions and hands each to f. On a transport
// failure the connection is dropped (its completions still arrive, with
// StatusTransport). A server that misses the op deadline is stalled
// (dropped and skipped for a while) and collect returns nil with p.n
// requests unfinished: the last p.n posted, as completions come in order;
// an error means the caller's ctx ended.
func (io *IO) collect(ctx *opCtx, p *peer, f func(*rdma.Completion)) error {
	for p.n > 0 {
		cqes := io.cqes[:min(p.n, len(io.cqes))]
		// Wait returns what has arrived, reading the socket once, and
		// blocks only if nothing has. (A Poll first cost a readv that
		// found nothing right after the post: ~1 µs of a remote fault.)
		// No spinning: on the 2-CPU machines, with memory servers
		// sharing the CPUs, 50 µs of it made remote faults 5-10× slower,
		// and 5 µs gained nothing (measured).
		got, err := p.c.Wait(ctx, cqes)
		if err != nil {
			if ctx.Context.Err() != nil {
				p.drop()
				return err // the caller's ctx ended
			}
			// The server missed the op deadline: the caller fails
			// the requests it left unfinished over.
			io.t.stalls.Add(1)
			p.stall()
			return nil
		}
		for j := 0; j < got; j++ {
			f(&io.cqes[j])
		}
		p.n -= got
	}
	return nil
}

// classify records why a request failed and marks what it says.
func (io *IO) classify(id remote.SlabID, server string, st rdma.Status, p *peer, why *uint8) {
	switch st {
	case rdma.StatusRevokedKey, rdma.StatusUnknownKey:
		// The server no longer has the slab under this key: the data is
		// gone (or the replica was just dropped by a migration: then
		// markLost finds nothing to mark).
		*why |= whyLost
		io.t.markLost(id, server)
	case rdma.StatusTransport:
		*why |= whyUnavailable
		p.drop()
	default:
		*why |= whyUnavailable
	}
}

func (io *IO) fail(op *remote.PageOp, why uint8) {
	switch {
	case why&whyUnavailable != 0:
		op.Err = remote.ErrUnavailable
		return
	case why&whyCorrupt != 0:
		op.Err = remote.ErrCorrupt
	default:
		op.Err = remote.ErrLost
	}
	if !isShard(op.Slab) { // a shard's page is reconstructed, or counted then (ec.go)
		io.t.lost.Add(1)
	}
}

// failAll sets err on every op not failed yet, and returns it (a call cut
// short: ctx done, closed).
func (io *IO) failAll(ops []remote.PageOp, err error) error {
	for i := range ops {
		if ops[i].Err == nil {
			ops[i].Err = err
		}
	}
	return err
}

// Write implements remote.PageIO.
func (io *IO) Write(ctx context.Context, ops []remote.PageOp) error {
	if io.t.hasGroups.Load() {
		if io.partial(ops) {
			return io.ecWritePartial(ctx, ops)
		}
		return io.ecWrite(ctx, ops)
	}
	return io.writeReplicas(ctx, ops)
}

// writeReplicas writes ops of slabs with replicas (a group's shards are).
func (io *IO) writeReplicas(ctx context.Context, ops []remote.PageOp) error {
	defer io.endCall()
	io.t.copyMu.RLock()
	defer io.t.copyMu.RUnlock()
	per := max(1, io.depth/8) // ops per chunk: up to 8 replicas each
	for len(ops) > 0 {
		n := min(len(ops), per)
		if err := io.writeChunk(ctx, ops[:n]); err != nil {
			return io.failAll(ops, err)
		}
		ops = ops[n:]
	}
	return nil
}

func (io *IO) writeChunk(parent context.Context, ops []remote.PageOp) error {
	ctx := io.begin(parent)
	// One WR per (op, live replica), posted per connection.
	nw := 0
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		io.writes[i] = writeOp{}
		e, ok := io.t.entry(op.Slab)
		if !ok {
			op.Err = remote.ErrUnknownSlab
			continue
		}
		reps := e.reps
		io.writes[i].sums, io.writes[i].file = e.sums, e.file
		for ri := range reps {
			r := &reps[ri]
			if r.State == Lost {
				continue
			}
			p := io.peer(ctx, r)
			io.wrs[nw] = rdma.WorkRequest{ID: uint64(nw), Op: rdma.OpWrite, Key: r.Key, Offset: op.Off, Local: op.Buf}
			req := &io.reqs[nw]
			*req = writeReq{op: int32(i), via: p, srv: r.Server}
			if r.State == Filling {
				req.marks = wrFilling
			}
			if p == nil { // not dialled: this replica misses the WRITE
				io.writes[i].why |= whyUnavailable
				req.marks |= wrFailed
			}
			nw++
		}
	}
	failed := func(w int) {
		io.writes[io.reqs[w].op].why |= whyUnavailable
		io.reqs[w].marks |= wrFailed
	}
	for _, p := range io.active {
		buf := io.scratch(0)[:0]
		for w := 0; w < nw; w++ {
			if io.reqs[w].via == p {
				buf = append(buf, io.wrs[w])
			}
		}
		if err := p.c.Post(buf); err != nil {
			for w := 0; w < nw; w++ {
				if io.reqs[w].via == p {
					failed(w)
				}
			}
			p.drop()
			continue
		}
		p.n = len(buf)
	}
	for _, p := range io.active {
		err := io.collect(ctx, p, func(c *rdma.Completion) {
			w := int(c.ID)
			if c.Status != rdma.StatusOK {
				failed(w)
				if c.Status == rdma.StatusTransport {
					p.drop()
				}
				return
			}
			if req := &io.reqs[w]; req.marks&wrFilling == 0 {
				io.writes[req.op].ok++ // a Filling replica is not read yet: it does not count
			}
		})
		if err != nil {
			io.endRound()
			return err
		}
		// A stalled server's replicas miss its last p.n WRITEs (posted
		// in order, completed in order); they are marked stale below if
		// another replica took them.
		for w := nw - 1; w >= 0 && p.n > 0; w-- {
			if io.reqs[w].via == p {
				failed(w)
				p.n--
			}
		}
	}
	io.endRound()
	for i := range ops {
		op := &ops[i]
		if op.Err != nil {
			continue
		}
		if io.writes[i].ok == 0 {
			// Nothing written: every replica keeps the previous version.
			if io.writes[i].why == 0 {
				op.Err = remote.ErrLost
			} else {
				op.Err = remote.ErrUnavailable
			}
			continue
		}
		io.t.writes.Add(1)
		lo, hi := recordSums(io.writes[i].sums, op.Off, op.Buf)
		io.sumBuf = io.writes[i].file.write(io.writes[i].sums, lo, hi, io.sumBuf)
	}
	// Replicas that missed a WRITE a healthy replica took are stale. One
	// that only a Filling replica took is not written (the caller
	// retries): marking the healthy replicas that missed it stale would
	// leave the slab nothing to read, nor to finish the copy from.
	for _, req := range io.reqs[:nw] {
		if req.marks&wrFailed != 0 && io.writes[req.op].ok > 0 {
			io.t.markLost(ops[req.op].Slab, req.srv)
		}
	}
	return nil
}
