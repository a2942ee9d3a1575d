package pager

import (
	"context"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/pager/remote"
)

// evictState is the eviction's state: the CLOCK hand over the client's
// page tables, the staging area, the batch in flight and its write-backs.
// Its decisions take the time as an argument.
type evictState struct {
	clock      Clock
	stagingFD  int
	staging    []byte
	stageFree  []uint32
	stageOwner []pageRef
	evict      proto.Evict
	evictRefs  [proto.MaxEvictBatch]pageRef
	newSlots   [proto.MaxEvictBatch]Slot // pool slots for an eviction's dirty victims
	evictBusy  bool
	evictSent  time.Time // when the EVICT in flight was sent
	kept       bool      // the last EVICT kept every page (EBUSY: traced, or pinned by system calls): faults do not wait
	evictSeq   uint64
	staged     int // pages in Staged state waiting for a write-back retry
	wb         []remote.PageOp
	wbRef      []int
	wbRuns     []remote.PageOp // wb merged into runs (writeBack)
	wbRunAt    []int           // the first op of wb in each run
	wbBuf      []byte          // the pages of runs, copied in order (made at the first merge)
	victims    []Victim
}

// maxThrottle is how long a fault past the budget waits for the eviction
// in flight (throttle) before the budget bends.
const maxThrottle = 50 * time.Millisecond

// stageBuf returns staging slot s's page of the staging area.
func (e *evictState) stageBuf(s int) []byte { return e.staging[s*pageSize : (s+1)*pageSize] }

// stageOf returns the staging slot holding page idx of r, or -1.
func (e *evictState) stageOf(r *region, idx int) int {
	for s, o := range e.stageOwner {
		if o.r == r && o.idx == idx {
			return s
		}
	}
	return -1
}

// takeStage takes a free staging slot for ref (there is one: the caller
// checked).
func (e *evictState) takeStage(ref pageRef) uint32 {
	s := e.stageFree[len(e.stageFree)-1]
	e.stageFree = e.stageFree[:len(e.stageFree)-1]
	e.stageOwner[s] = ref
	return s
}

// freeStage gives staging slot s back (client.freeStage also tells the
// journal).
func (e *evictState) freeStage(s int) {
	e.stageOwner[s] = pageRef{}
	e.stageFree = append(e.stageFree, uint32(s))
}

// sent records the EVICT of the batch in flight sent at now.
func (e *evictState) sent(now time.Time) { e.evictBusy, e.evictSent = true, now }

// throttles reports whether a fault past the budget still waits at now
// for the eviction in flight: measured from the EVICT, not from the fault,
// so that a fault that waited for room (pool full) does not pass the
// budget the moment room returns and an eviction starts.
func (e *evictState) throttles(now time.Time) bool { return now.Sub(e.evictSent) < maxThrottle }

// writeBack writes e.wb, staged pages one op each, to the pool through
// io, each op's Err set. A run of ops whose pool slots are adjacent in one
// slab goes as one WRITE of the run's pages, copied in order into wbBuf (a
// batch's worth, as wb holds): an eviction batch takes consecutive slots
// for its sorted victims (slotsFor), so its dirty pages are mostly one
// run. 124 WRITEs of a page each took 1.2 ms over tcp, and the loop
// serves no fault meanwhile (glibc's merge sort of 128 MiB at 32 MiB
// local: 2,310 write-backs, 2.8 s of its 12 s).
func (e *evictState) writeBack(ctx context.Context, io remote.PageIO) {
	ops := e.wb
	e.wbRuns, e.wbRunAt = e.wbRuns[:0], e.wbRunAt[:0]
	used := 0
	for k := 0; k < len(ops); {
		j := k + 1
		for j < len(ops) && ops[j].Slab == ops[k].Slab && ops[j].Off == ops[j-1].Off+pageSize {
			j++
		}
		run := ops[k]
		if j-k > 1 {
			if e.wbBuf == nil {
				e.wbBuf = make([]byte, cap(e.wb)*pageSize)
			}
			run.Buf = e.wbBuf[used : used+(j-k)*pageSize]
			for m := k; m < j; m++ {
				copy(run.Buf[(m-k)*pageSize:], ops[m].Buf)
			}
			used += len(run.Buf)
		}
		e.wbRuns = append(e.wbRuns, run)
		e.wbRunAt = append(e.wbRunAt, k)
		k = j
	}
	io.Write(ctx, e.wbRuns)
	spreadErrs(ops, e.wbRuns, e.wbRunAt)
}

// spreadErrs sets each op's Err from the run it went in: runs[r] carried
// ops[at[r]:at[r+1]] (readBatch.merge, writeBack).
func spreadErrs(ops, runs []remote.PageOp, at []int) {
	for r, run := range runs {
		start, end := runOps(at, r, len(ops))
		for k := start; k < end; k++ {
			ops[k].Err = run.Err
		}
	}
}

// runOps returns the ops [start, end) of run r, whose first ops are at
// (n ops in all).
func runOps(at []int, r, n int) (start, end int) {
	end = n
	if r+1 < len(at) {
		end = at[r+1]
	}
	return at[r], end
}

// release unmaps and closes the staging area (teardown).
func (e *evictState) release() {
	unix.Munmap(e.staging)
	unix.Close(e.stagingFD)
}
