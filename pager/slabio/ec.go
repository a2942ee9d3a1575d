package slabio

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/klauspost/reedsolomon"

	"rmem/pager/remote"
)

// Erasure-coded slabs. A group is one slab of the caller's (its SlabID, K
// times the Table's slab size) kept as K data shards and M parity shards,
// each a slab of the Table's size on a server of its own (Put by PutGroup
// as slabs of their own: ShardID). Page p of the group is page p/K of data
// shard p%K: consecutive pages go to different servers, and a page is
// read with one READ from one server. Row r of the shards (page r of
// each) is a stripe: its M parity pages are a Reed-Solomon code of its K
// data pages, so any K of its K+M pages give the others back.
//
// Rules:
//   - A READ of a page goes to its data shard. If that fails (the shard
//     lost, unreachable, or the copy fails its checksum), the stripe's
//     other pages are read and the page is reconstructed (a degraded
//     read); a bad copy is then rewritten (repaired).
//   - A WRITE of pages recomputes the parity of every stripe it touches
//     from the stripe's K data pages: those written, and the others as
//     they are in the pool (read, or reconstructed). A data page never
//     written (no checksum) counts as zeros, so a fresh stripe is written
//     without reads, and so is every stripe a WRITE covers whole (an
//     eviction batch). The data and parity pages go out as one batch.
//     WRITEs and degraded READs of a stripe exclude each other
//     (stripeMu), so the parity always matches the data pages.
//   - A shard that misses a WRITE its stripe took (at least K of its
//     pages hold the new state) is marked Lost, as a stale replica is,
//     and rebuilt by the Store (Migrate reconstructs it). A stripe left
//     with fewer than K good pages fails the WRITE (ErrUnavailable: the
//     caller retries).
//   - Checksums are per shard page, data and parity alike (each shard is
//     a slab of the Table), so a bad shard page counts as missing.

// shardBit is where a shard's number starts in its SlabID: pool slab ids
// stay far below it.
const shardBit = 48

// ShardID returns the SlabID of shard i of group id.
func ShardID(id remote.SlabID, i int) remote.SlabID {
	return id | remote.SlabID(i+1)<<shardBit
}

// ShardOf returns the group and shard number of id, ok false if id is not
// a shard.
func ShardOf(id remote.SlabID) (group remote.SlabID, shard int, ok bool) {
	if !isShard(id) {
		return id, 0, false
	}
	g, s := shardOf(id)
	return g, s, true
}

// isShard reports whether id names a shard of a group.
func isShard(id remote.SlabID) bool { return id>>shardBit != 0 }

// shardOf returns the group and the shard number of shard id.
func shardOf(id remote.SlabID) (remote.SlabID, int) {
	return id & (1<<shardBit - 1), int(id>>shardBit) - 1
}

// group is an erasure-coded slab: k data and m parity shards.
type group struct {
	k, m   int
	shards []remote.SlabID // k+m: data, then parity
}

// ErrLayout: an op past the end of an erasure-coded slab.
var ErrLayout = errors.New("slabio: op past the end of an erasure-coded slab")

// stripeLocks is the number of locks stripes hash to.
const stripeLocks = 64

func stripeLock(id remote.SlabID, row int) int {
	return int((uint64(id)*0x9E3779B97F4A7C15 + uint64(row)) % stripeLocks)
}

// PutGroup adds erasure-coded slab id of k data and m parity shards,
// shards[i] being shard i's replicas (one normally; a replacement being
// filled makes two). Its size is k times the Table's slab size. With m 0
// the pages are only striped over k slabs that have replicas of their
// own (a fallback while too few servers are up for k+m shards).
func (t *Table) PutGroup(id remote.SlabID, k, m int, shards [][]Replica) error {
	return t.putGroup(id, k, m, shards, false)
}

// AdoptGroup is PutGroup for a group an agent before this one wrote
// (Adopt): each shard's checksums are loaded.
func (t *Table) AdoptGroup(id remote.SlabID, k, m int, shards [][]Replica) error {
	return t.putGroup(id, k, m, shards, true)
}

func (t *Table) putGroup(id remote.SlabID, k, m int, shards [][]Replica, keep bool) error {
	if k < 1 || m < 0 || len(shards) != k+m || k+m > maxShards || isShard(id) {
		return fmt.Errorf("slabio: group %d: %d shards for %d+%d", id, len(shards), k, m)
	}
	g := &group{k: k, m: m, shards: make([]remote.SlabID, k+m)}
	var errs []error
	for i, reps := range shards {
		g.shards[i] = ShardID(id, i)
		if err := t.put(g.shards[i], reps, keep); err != nil {
			errs = append(errs, err)
		}
	}
	t.mu.Lock()
	t.groups[id] = g
	t.mu.Unlock()
	t.hasGroups.Store(true)
	return errors.Join(errs...)
}

// Group returns the shards of erasure-coded slab id, data then parity,
// and k (nil, 0 if id is not one).
func (t *Table) Group(id remote.SlabID) (shards []remote.SlabID, k int) {
	g := t.group(id)
	if g == nil {
		return nil, 0
	}
	return slices.Clone(g.shards), g.k
}

func (t *Table) group(id remote.SlabID) *group {
	t.mu.RLock()
	g := t.groups[id]
	t.mu.RUnlock()
	return g
}

// Layout returns how slab id is kept: copies per page slot (replicas not
// lost; 1 per shard of a group), and k, m of a group (1, 0 otherwise).
// The servers hold copies x (pages used) + m x (stripes used) slots.
func (t *Table) Layout(id remote.SlabID) (copies, k, m int) {
	if g := t.group(id); g != nil && g.m > 0 {
		return 1, g.k, g.m
	} else if g != nil {
		return t.Copies(g.shards[0]), g.k, 0
	}
	return t.Copies(id), 1, 0
}

// ecIO is an IO's scratch for erasure-coded slabs; nothing in it lives
// past a call.
type ecIO struct {
	enc    map[[2]int]reedsolomon.Encoder // per k, m (an IO's own)
	inner  []remote.PageOp                // the shard ops of a call
	back   []ecRef                        // per inner op: where it came from
	pages  [][]byte                       // scratch pages, pages[:used] taken
	used   int
	strs   []stripe
	at     map[stripeKey]int // stripe index in strs
	locks  []int
	shards [][]byte
	row    []remote.PageOp
	rowOf  []int // per row op: its shard
	need   []bool
	zero   []byte
}

type ecRef struct {
	op   int32 // the caller's op
	page int32 // its page (-1: the op itself, not on a group)
	str  int32 // Write: the stripe's index
	sh   int32 // Write: the shard (-1: the op is the caller's)
}

type stripeKey struct {
	id  remote.SlabID
	row int
}

// stripe is a stripe a Write touches.
type stripe struct {
	key   stripeKey
	g     *group
	data  [maxShards][]byte // the K data pages (nil: not written by this call)
	fill  uint32            // data pages put in by fillStripes, not the caller's
	pages [maxShards][]byte // the K+M pages as encoded
	// wrote, failed: the shards whose WRITE of the stripe's page
	// succeeded, failed.
	wrote, failed uint32
	why           uint8
	err           error // the stripe could not be written
}

const maxShards = 16

func (e *ecIO) encoder(k, m int) (reedsolomon.Encoder, error) {
	if enc := e.enc[[2]int{k, m}]; enc != nil {
		return enc, nil
	}
	enc, err := reedsolomon.New(k, m, reedsolomon.WithMaxGoroutines(1))
	if err != nil {
		return nil, err
	}
	if e.enc == nil {
		e.enc = map[[2]int]reedsolomon.Encoder{}
	}
	e.enc[[2]int{k, m}] = enc
	return enc, nil
}

// page returns a scratch page for this call.
func (e *ecIO) page() []byte {
	if e.used == len(e.pages) {
		e.pages = append(e.pages, make([]byte, pageSize))
	}
	p := e.pages[e.used]
	e.used++
	return p
}

func (e *ecIO) zeroPage() []byte {
	if e.zero == nil {
		e.zero = make([]byte, pageSize)
	}
	return e.zero
}

// pageOf returns shard s and row r of page p of g.
func (g *group) pageOf(p int) (s, r int) { return p % g.k, p / g.k }

// checkOp checks that op is whole pages within g, and returns its first
// page.
func (t *Table) checkOp(g *group, op *remote.PageOp) (int, bool) {
	size := uint64(g.k) * t.slabSize
	if op.Off%pageSize != 0 || len(op.Buf)%pageSize != 0 || len(op.Buf) == 0 || op.Off+uint64(len(op.Buf)) > size {
		return 0, false
	}
	return int(op.Off / pageSize), true
}

// written reports whether shard page (id, row) holds a page written (it
// has a checksum).
func (t *Table) written(id remote.SlabID, row int) bool {
	e, ok := t.entry(id)
	return ok && row < len(e.sums) && e.sums[row].Load()&sumValid != 0
}

// live reports whether shard id has a Healthy replica.
func (t *Table) live(id remote.SlabID) bool {
	reps, _ := t.lookup(id)
	for _, r := range reps {
		if r.State == Healthy {
			return true
		}
	}
	return false
}

// partial reports whether an op of ops covers pages of a group in part.
func (io *IO) partial(ops []remote.PageOp) bool {
	for i := range ops {
		op := &ops[i]
		if (op.Off%pageSize != 0 || len(op.Buf)%pageSize != 0) && io.t.group(op.Slab) != nil {
			return true
		}
	}
	return false
}

// wholePages returns ops with each op that covers pages of a group in part
// made whole: a buffer of its pages, filled from the pool when write is
// set (the op's bytes laid over them); from[j] is the op whole[j] stands
// for. It allocates: only a swap file's unaligned blocks do this.
func (io *IO) wholePages(ctx context.Context, ops []remote.PageOp, write bool) (whole []remote.PageOp, from []int, err error) {
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		g := io.t.group(op.Slab)
		if g == nil || (op.Off%pageSize == 0 && len(op.Buf)%pageSize == 0) {
			whole, from = append(whole, *op), append(from, i)
			continue
		}
		lo := op.Off &^ (pageSize - 1)
		hi := (op.Off + uint64(len(op.Buf)) + pageSize - 1) &^ (pageSize - 1)
		w := remote.PageOp{Slab: op.Slab, Off: lo, Buf: make([]byte, hi-lo)}
		if write {
			rd := []remote.PageOp{w}
			if err := io.ecRead(ctx, rd); err != nil {
				return nil, nil, err
			}
			if rd[0].Err != nil {
				op.Err = rd[0].Err
				continue
			}
			copy(w.Buf[op.Off-lo:], op.Buf)
		}
		whole, from = append(whole, w), append(from, i)
	}
	return whole, from, nil
}

// ecReadPartial is ecRead for ops that cover pages in part.
func (io *IO) ecReadPartial(ctx context.Context, ops []remote.PageOp) error {
	whole, from, err := io.wholePages(ctx, ops, false)
	if err == nil {
		err = io.ecRead(ctx, whole)
	}
	if err != nil {
		return io.failAll(ops, err)
	}
	for j := range whole {
		op := &ops[from[j]]
		op.Err, op.Corrupt = whole[j].Err, whole[j].Corrupt
		if &whole[j].Buf[0] != &op.Buf[0] {
			copy(op.Buf, whole[j].Buf[op.Off-whole[j].Off:])
		}
	}
	return nil
}

// ecWritePartial is ecWrite for ops that cover pages in part: their pages
// are read, changed and written whole (not atomically: the pager never
// writes a page two ways at once, nor does the kernel a swap block).
func (io *IO) ecWritePartial(ctx context.Context, ops []remote.PageOp) error {
	whole, from, err := io.wholePages(ctx, ops, true)
	if err == nil {
		err = io.ecWrite(ctx, whole)
	}
	if err != nil {
		return io.failAll(ops, err)
	}
	for j := range whole {
		if op := &ops[from[j]]; op.Err == nil {
			op.Err = whole[j].Err
		}
	}
	return nil
}

// ecRead is Read when the Table has groups.
func (io *IO) ecRead(ctx context.Context, ops []remote.PageOp) error {
	e := &io.ec
	e.inner, e.back, e.used = e.inner[:0], e.back[:0], 0
	for i := range ops {
		op := &ops[i]
		op.Err, op.Corrupt = nil, 0
		g := io.t.group(op.Slab)
		if g == nil {
			e.inner = append(e.inner, *op)
			e.back = append(e.back, ecRef{op: int32(i), page: -1})
			continue
		}
		first, ok := io.t.checkOp(g, op)
		if !ok {
			op.Err = ErrLayout
			continue
		}
		for j := 0; j < len(op.Buf)/pageSize; j++ {
			s, r := g.pageOf(first + j)
			e.inner = append(e.inner, remote.PageOp{Slab: g.shards[s], Off: uint64(r) * pageSize, Buf: op.Buf[j*pageSize : (j+1)*pageSize]})
			e.back = append(e.back, ecRef{op: int32(i), page: int32(j)})
		}
	}
	if err := io.readReplicas(ctx, e.inner); err != nil {
		return io.failAll(ops, err)
	}
	for n := range e.inner {
		in, b := &e.inner[n], e.back[n]
		op := &ops[b.op]
		if b.page < 0 {
			op.Err, op.Corrupt = in.Err, in.Corrupt
			continue
		}
		op.Corrupt += in.Corrupt
		err := in.Err
		if err != nil && !errors.Is(err, remote.ErrUnknownSlab) && g0(io.t, op.Slab) {
			// A degraded read: the page from the rest of its stripe.
			g := io.t.group(op.Slab)
			if g == nil {
				err = remote.ErrUnknownSlab
			} else {
				s, r := g.pageOf(int(op.Off/pageSize) + int(b.page))
				e.used = 0 // scratch of earlier reconstructions is done with
				var bad uint32
				bad, err = io.reconstruct(ctx, op.Slab, g, s, r, in.Buf, true)
				op.Corrupt += bad
				if err == nil && errors.Is(in.Err, remote.ErrCorrupt) && !io.noFix {
					io.repairShard(ctx, g.shards[s], r, in.Buf)
				}
				if err != nil && ctx.Err() != nil {
					return io.failAll(ops, ctx.Err())
				}
			}
		}
		if err != nil && (op.Err == nil || errors.Is(err, remote.ErrCorrupt)) {
			op.Err = err
		}
	}
	return nil
}

// g0 reports whether slab id is a group with parity.
func g0(t *Table, id remote.SlabID) bool {
	g := t.group(id)
	return g != nil && g.m > 0
}

// recordShardSum records the checksum of page row of shard id as buf's.
func (io *IO) recordShardSum(id remote.SlabID, row int, buf []byte) {
	e, ok := io.t.entry(id)
	if !ok {
		return
	}
	lo, hi := recordSums(e.sums, uint64(row)*pageSize, buf)
	io.sumBuf = e.file.write(e.sums, lo, hi, io.sumBuf)
}

// repairShard writes a reconstructed page back to its shard, whose copy
// failed its checksum.
func (io *IO) repairShard(ctx context.Context, id remote.SlabID, row int, buf []byte) {
	op := [1]remote.PageOp{{Slab: id, Off: uint64(row) * pageSize, Buf: buf}}
	if io.writeReplicas(ctx, op[:]) == nil && op[0].Err == nil {
		io.t.repaired.Add(1)
	}
}

// reconstruct fills dst with page row of shard s of group id from the
// stripe's other pages, and returns how many of their copies failed
// their checksums. lock takes the stripe's lock (a caller that holds it,
// or copyMu, passes false).
func (io *IO) reconstruct(ctx context.Context, id remote.SlabID, g *group, s, row int, dst []byte, lock bool) (uint32, error) {
	if lock {
		l := &io.t.stripeMu[stripeLock(id, row)]
		l.Lock()
		defer l.Unlock()
	}
	e := &io.ec
	n := g.k + g.m
	e.row, e.rowOf = e.row[:0], e.rowOf[:0]
	e.shards = e.shards[:0]
	for t := 0; t < n; t++ {
		e.shards = append(e.shards, nil)
	}
	for t := 0; t < n; t++ {
		switch {
		case t == s:
			e.shards[t] = dst[:0]
		case t < g.k && !io.t.written(g.shards[t], row):
			e.shards[t] = e.zeroPage() // never written: zeros
		default:
			p := e.page()
			e.shards[t] = p[:0] // missing until read
			e.row = append(e.row, remote.PageOp{Slab: g.shards[t], Off: uint64(row) * pageSize, Buf: p})
			e.rowOf = append(e.rowOf, t)
		}
	}
	if err := io.readReplicas(ctx, e.row); err != nil {
		return 0, err
	}
	var bad uint32
	var why uint8
	have := 0
	for t := range e.shards {
		if t != s && len(e.shards[t]) > 0 {
			have++ // zeros
		}
	}
	for j := range e.row {
		op := &e.row[j]
		bad += op.Corrupt
		switch {
		case op.Err == nil:
			e.shards[e.rowOf[j]] = op.Buf
			have++
		case errors.Is(op.Err, remote.ErrCorrupt):
			why |= whyCorrupt
		case errors.Is(op.Err, remote.ErrUnavailable):
			why |= whyUnavailable
		default:
			why |= whyLost
		}
	}
	if have < g.k {
		io.t.lost.Add(1)
		switch {
		case why&whyUnavailable != 0:
			return bad, remote.ErrUnavailable
		case why&whyCorrupt != 0:
			return bad, remote.ErrCorrupt
		}
		return bad, remote.ErrLost
	}
	enc, err := e.encoder(g.k, g.m)
	if err != nil {
		return bad, err
	}
	if s < g.k {
		e.need = e.need[:0]
		for t := 0; t < n; t++ {
			e.need = append(e.need, t == s)
		}
		err = enc.ReconstructSome(e.shards, e.need)
	} else {
		err = enc.Reconstruct(e.shards)
	}
	if err != nil {
		return bad, fmt.Errorf("slabio: reconstruct slab %d row %d: %w", id, row, err)
	}
	if sums, ok := io.t.entry(g.shards[s]); ok && row < len(sums.sums) {
		if want := sums.sums[row].Load(); want&sumValid != 0 && pageSum(dst[:pageSize]) != want {
			return bad, remote.ErrCorrupt
		}
	}
	io.t.reads.Add(1)
	io.t.degraded.Add(1)
	return bad, nil
}

// ecWrite is Write when the Table has groups: ops on plain slabs go out as
// they are, pages of groups with their stripes' new parity.
func (io *IO) ecWrite(ctx context.Context, ops []remote.PageOp) error {
	e := &io.ec
	e.inner, e.back, e.strs, e.used = e.inner[:0], e.back[:0], e.strs[:0], 0
	if e.at == nil {
		e.at = map[stripeKey]int{}
	}
	clear(e.at)
	// The stripes the ops touch, with the data pages they write.
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		g := io.t.group(op.Slab)
		if g == nil {
			e.inner = append(e.inner, *op)
			e.back = append(e.back, ecRef{op: int32(i), page: -1, sh: -1})
			continue
		}
		first, ok := io.t.checkOp(g, op)
		if !ok {
			op.Err = ErrLayout
			continue
		}
		if g.m == 0 { // striped only: each page to its slab's replicas
			for j := 0; j < len(op.Buf)/pageSize; j++ {
				s, r := g.pageOf(first + j)
				e.inner = append(e.inner, remote.PageOp{Slab: g.shards[s], Off: uint64(r) * pageSize, Buf: op.Buf[j*pageSize : (j+1)*pageSize]})
				e.back = append(e.back, ecRef{op: int32(i), page: int32(j), sh: -1})
			}
			continue
		}
		for j := 0; j < len(op.Buf)/pageSize; j++ {
			s, r := g.pageOf(first + j)
			k := stripeKey{op.Slab, r}
			x, ok := e.at[k]
			if !ok {
				x = len(e.strs)
				e.at[k] = x
				e.strs = append(e.strs, stripe{key: k, g: g})
			}
			e.strs[x].data[s] = op.Buf[j*pageSize : (j+1)*pageSize]
		}
	}
	// Lock the stripes, in lock order.
	e.locks = e.locks[:0]
	for _, st := range e.strs {
		e.locks = append(e.locks, stripeLock(st.key.id, st.key.row))
	}
	slices.Sort(e.locks)
	e.locks = slices.Compact(e.locks)
	for _, l := range e.locks {
		io.t.stripeMu[l].Lock()
	}
	defer func() {
		for _, l := range e.locks {
			io.t.stripeMu[l].Unlock()
		}
	}()
	// The data pages of each stripe not written here: zeros if never
	// written, else as the pool holds them.
	if err := io.fillStripes(ctx); err != nil {
		return io.failAll(ops, err)
	}
	// Parity, and the shard ops.
	for x := range e.strs {
		st := &e.strs[x]
		if st.err != nil {
			continue
		}
		g := st.g
		enc, err := e.encoder(g.k, g.m)
		if err != nil {
			st.err = err
			continue
		}
		e.shards = e.shards[:0]
		for s := 0; s < g.k; s++ {
			e.shards = append(e.shards, st.data[s])
		}
		for s := 0; s < g.m; s++ {
			e.shards = append(e.shards, e.page())
		}
		if err := enc.Encode(e.shards); err != nil {
			st.err = err
			continue
		}
		copy(st.pages[:], e.shards)
		off := uint64(st.key.row) * pageSize
		for s := 0; s < g.k+g.m; s++ {
			if s < g.k && !st.writes(s) {
				continue
			}
			e.inner = append(e.inner, remote.PageOp{Slab: g.shards[s], Off: off, Buf: e.shards[s]})
			e.back = append(e.back, ecRef{op: -1, page: -1, str: int32(x), sh: int32(s)})
		}
	}
	if err := io.writeReplicas(ctx, e.inner); err != nil {
		return io.failAll(ops, err)
	}
	// What each stripe took.
	for n := range e.inner {
		in, b := &e.inner[n], e.back[n]
		if b.sh < 0 {
			if op := &ops[b.op]; b.page < 0 || op.Err == nil {
				op.Err = in.Err
			}
			continue
		}
		st := &e.strs[b.str]
		if in.Err == nil {
			st.wrote |= 1 << b.sh
			continue
		}
		st.failed |= 1 << b.sh
		if errors.Is(in.Err, remote.ErrUnavailable) {
			st.why |= whyUnavailable
		}
	}
	for x := range e.strs {
		io.settle(&e.strs[x])
	}
	// Each caller's page takes its stripe's outcome.
	for i := range ops {
		op := &ops[i]
		g := io.t.group(op.Slab)
		if g == nil || op.Err != nil {
			continue
		}
		if g.m == 0 {
			io.t.writes.Add(1)
			continue
		}
		first := int(op.Off / pageSize)
		for j := 0; j < len(op.Buf)/pageSize; j++ {
			_, r := g.pageOf(first + j)
			if err := e.strs[e.at[stripeKey{op.Slab, r}]].err; err != nil {
				op.Err = err
				break
			}
		}
		if op.Err == nil {
			io.t.writes.Add(1)
		}
	}
	return nil
}

// page returns page s of st as written: data, or the parity computed.
func (st *stripe) page(s int) []byte { return st.pages[s] }

// writes reports whether the caller writes data page s of st.
func (st *stripe) writes(s int) bool { return st.data[s] != nil && st.fill&(1<<s) == 0 }

// fillStripes puts in each stripe's data pages not written by the call.
func (io *IO) fillStripes(ctx context.Context) error {
	e := &io.ec
	e.row, e.rowOf = e.row[:0], e.rowOf[:0]
	for x := range e.strs {
		st := &e.strs[x]
		for s := 0; s < st.g.k; s++ {
			if st.data[s] != nil {
				continue
			}
			st.fill |= 1 << s
			if !io.t.written(st.g.shards[s], st.key.row) {
				st.data[s] = e.zeroPage()
				continue
			}
			p := e.page()
			st.data[s] = p
			e.row = append(e.row, remote.PageOp{Slab: st.g.shards[s], Off: uint64(st.key.row) * pageSize, Buf: p})
			e.rowOf = append(e.rowOf, x<<8|s)
		}
	}
	if len(e.row) == 0 {
		return nil
	}
	if err := io.readReplicas(ctx, e.row); err != nil {
		return err
	}
	// Pages that could not be read come from the rest of their stripe
	// (the stripe's lock is held). reconstruct reuses e.row: walk a copy
	// of the failures.
	type miss struct {
		x, s int
		buf  []byte
		err  error
	}
	var misses []miss
	for j := range e.row {
		if op := &e.row[j]; op.Err != nil {
			misses = append(misses, miss{e.rowOf[j] >> 8, e.rowOf[j] & 0xff, op.Buf, op.Err})
		}
	}
	for _, ms := range misses {
		st := &e.strs[ms.x]
		if _, err := io.reconstruct(ctx, st.key.id, st.g, ms.s, st.key.row, ms.buf, false); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			st.err = err
		}
	}
	return nil
}

// settle decides what a stripe's WRITE did: with at least K of its pages
// holding the new state it took, and the shards that missed it are marked
// Lost (stale, to be rebuilt); otherwise it failed.
func (io *IO) settle(st *stripe) {
	if st.err != nil {
		return
	}
	g := st.g
	wrote, failed, why := st.wrote, st.failed, st.why
	good := 0
	for s := 0; s < g.k+g.m; s++ {
		switch {
		case wrote&(1<<s) != 0:
			good++
		case failed&(1<<s) != 0:
		case s < g.k && (!io.t.written(g.shards[s], st.key.row) || io.t.live(g.shards[s])):
			good++ // not written here: zeros, or its page as before
		}
	}
	if good < g.k {
		if why != 0 || good > 0 {
			st.err = remote.ErrUnavailable
		} else {
			st.err = remote.ErrLost
		}
		return
	}
	for s := 0; s < g.k+g.m; s++ {
		if failed&(1<<s) == 0 {
			continue
		}
		// The shard missed its page: the page's checksum is still its
		// new contents' (what a degraded read or the rebuild gives).
		io.recordShardSum(g.shards[s], st.key.row, st.page(s))
		reps, _ := io.t.lookup(g.shards[s])
		for _, r := range reps {
			if r.State == Healthy {
				io.t.markLost(g.shards[s], r.Server)
			}
		}
	}
}

// rebuildChunk fills buf, bytes [off, off+len(buf)) of shard id, from the
// rest of each stripe (Migrate of a shard with no replica to copy from;
// copyMu is held, so no WRITE changes a stripe meanwhile). Pages never
// written are left zero; a page with no good copy is copied as it came
// (it fails its checksum wherever it goes, as in copySlab).
func (io *IO) rebuildChunk(ctx context.Context, id remote.SlabID, off uint64, buf []byte) error {
	gid, s := shardOf(id)
	g := io.t.group(gid)
	if g == nil {
		return remote.ErrUnknownSlab
	}
	for j := 0; j < len(buf)/pageSize; j++ {
		row := int(off/pageSize) + j
		page := buf[j*pageSize : (j+1)*pageSize]
		io.ec.used = 0
		if s < g.k && !io.t.written(id, row) {
			clear(page)
			continue
		}
		_, err := io.reconstruct(ctx, gid, g, s, row, page, false)
		if err != nil && !errors.Is(err, remote.ErrCorrupt) {
			return err
		}
	}
	return nil
}
