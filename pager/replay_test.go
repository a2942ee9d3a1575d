package pager

// The eviction policy replayed on page traces (docs/pager.md, Eviction):
// which policy, seeing which of the signals a user-space pager has on this
// kernel, keeps a program's hot pages resident. Each trace goes through
// LRU given every access, Belady's optimum, and a model of the agent: its
// budget and watermarks, eviction batches, the real Prefetcher on demand
// faults, and the policy told of accesses only as the signal shows them.

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// pageTrace is the page trace of a program: the sizes of its regions
// (tables) and its accesses in order.
type pageTrace struct {
	name   string
	tables []int
	tr     []touch
}

func (t pageTrace) pages() int {
	n := 0
	for _, p := range t.tables {
		n += p
	}
	return n
}

// writeAll is a program filling its heap (table 0) in order, as the bench
// workloads do before they read.
func writeAll(n int) []touch {
	tr := make([]touch, 0, n)
	for p := range n {
		tr = append(tr, touch{Victim{0, p}, true})
	}
	return tr
}

// zipfCDF is the cumulative distribution of ranks 0..n-1 drawn Zipfian
// with exponent theta.
func zipfCDF(n int, theta float64) []float64 {
	cdf := make([]float64, n)
	h := 0.0
	for r := range n {
		h += 1 / math.Pow(float64(r+1), theta)
	}
	acc := 0.0
	for r := range n {
		acc += 1 / math.Pow(float64(r+1), theta) / h
		cdf[r] = acc
	}
	return cdf
}

func drawRank(cdf []float64, rng *rand.Rand) int {
	u := rng.Float64()
	lo, hi := 0, len(cdf)-1
	for lo < hi {
		m := (lo + hi) / 2
		if cdf[m] < u {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// zipfTrace is bench/workload.c's zipf over n pages: the heap written,
// then reads of pages drawn Zipfian (theta 0.99), the ranks spread over the
// heap as the workload spreads them.
func zipfTrace(n, reads int) pageTrace {
	rng := rand.New(rand.NewSource(1))
	cdf := zipfCDF(n, 0.99)
	tr := writeAll(n)
	for range reads {
		tr = append(tr, touch{Victim{0, int(uint64(drawRank(cdf, rng)) * 2654435761 % uint64(n))}, false})
	}
	return pageTrace{"zipf", []int{n}, tr}
}

// uniformTrace is the heap written, then reads of pages drawn uniformly.
func uniformTrace(n, reads int) pageTrace {
	rng := rand.New(rand.NewSource(2))
	tr := writeAll(n)
	for range reads {
		tr = append(tr, touch{Victim{0, rng.Intn(n)}, false})
	}
	return pageTrace{"uniform", []int{n}, tr}
}

// scanHotTrace is a hot set (the heap's first hot pages) read all the
// time, perPage random reads of it for each page of a scan of the rest,
// scans times over.
func scanHotTrace(n, hot, perPage, scans int) pageTrace {
	rng := rand.New(rand.NewSource(3))
	tr := writeAll(n)
	for range scans {
		for p := hot; p < n; p++ {
			tr = append(tr, touch{Victim{0, p}, false})
			for range perPage {
				tr = append(tr, touch{Victim{0, rng.Intn(hot)}, false})
			}
		}
	}
	return pageTrace{"scan+hot", []int{n}, tr}
}

// redisTrace is Redis answering GETs, as its allocator lays it out: a
// hash table of 8-byte buckets (table 0), small allocations of 64 bytes a
// key (dictEntry, the key's sds, the value's robj: table 1) and 1 KiB
// values (table 2), each kind in pages of its own (jemalloc's size
// classes). A GET reads its bucket, writes its entry's page (lookupKey
// updates the robj's LRU clock) and reads its value. Keys are drawn
// Zipfian (theta 0.99) or uniformly; every key was set first.
func redisTrace(keys, gets int, zipf bool) pageTrace {
	rng := rand.New(rand.NewSource(4))
	nb, ne, nv := (keys*8+pageSize-1)/pageSize, (keys*64+pageSize-1)/pageSize, (keys*1024+pageSize-1)/pageSize
	var tr []touch
	bucket := make([]int, keys)
	for k := range keys {
		bucket[k] = rng.Intn(keys) * 8 / pageSize
		tr = append(tr, touch{Victim{0, bucket[k]}, true}, touch{Victim{1, k * 64 / pageSize}, true}, touch{Victim{2, k * 1024 / pageSize}, true})
	}
	perm := rng.Perm(keys) // key of each rank
	var cdf []float64
	name := "redis uniform"
	if zipf {
		cdf, name = zipfCDF(keys, 0.99), "redis zipf"
	}
	for range gets {
		k := rng.Intn(keys)
		if zipf {
			k = perm[drawRank(cdf, rng)]
		}
		tr = append(tr, touch{Victim{0, bucket[k]}, false}, touch{Victim{1, k * 64 / pageSize}, true}, touch{Victim{2, k * 1024 / pageSize}, false})
	}
	return pageTrace{name, []int{nb, ne, nv}, tr}
}

// replayResult is what a replay counted: demand faults on pages in the
// pool (misses: the program waited for a READ), faults on pages taken away
// as samples (counted apart: with a local copy they cost no READ), and
// pages moved (read back, prefetches included, and written back).
type replayResult struct {
	misses, sampleFaults int
	traffic
}

func (r replayResult) faults() int { return r.misses + r.sampleFaults }

// lruTraffic replays tr under LRU given every access, capacity pages.
func lruTraffic(tr pageTrace, capacity int) replayResult {
	base := make([]int, len(tr.tables))
	for i := 1; i < len(base); i++ {
		base[i] = base[i-1] + tr.tables[i-1]
	}
	n := tr.pages()
	prev, next := make([]int32, n+1), make([]int32, n+1)
	head := int32(n)
	prev[head], next[head] = head, head
	in, pooled, dirty := make([]bool, n), make([]bool, n), make([]bool, n)
	resident := 0
	var r replayResult
	for _, a := range tr.tr {
		p := int32(base[a.Table] + a.Page)
		if in[p] {
			next[prev[p]], prev[next[p]] = next[p], prev[p]
		} else {
			if resident == capacity {
				v := prev[head]
				next[prev[v]], prev[next[v]] = next[v], prev[v]
				in[v] = false
				if dirty[v] {
					r.writeBacks++
					pooled[v], dirty[v] = true, false
				}
				resident--
			}
			if pooled[p] {
				r.misses++
				r.reads++
			}
			in[p] = true
			resident++
		}
		dirty[p] = dirty[p] || a.write
		prev[p], next[p] = head, next[head]
		prev[next[head]] = p
		next[head] = p
	}
	return r
}

// signal is what the agent's model is told of accesses to resident pages.
type signal int

const (
	// sigFaults: faults in and first writes (WP faults), as the agent sees
	// them, and with them refaults: a page evicted comes back (FlagGhost),
	// unless the model runs without history (CLOCK before hot and cold).
	sigFaults signal = iota
	// sigWritten: sigFaults and every write (PAGEMAP_SCAN of written
	// pages, with the uffd in WP_ASYNC mode).
	sigWritten
	// sigDAMON: sigFaults and the accessed bits DAMON reads for regions
	// of damonRegion pages of physical memory, every damonEvery accesses
	// (the pages of a region are the program's pages in random order).
	sigDAMON
	// sigEvery: every access (the kernel's accessed bits; DAMON with a
	// region per page).
	sigEvery
	// sigSample, sigSampleLocal: sigFaults and reference sampling: with
	// each eviction batch, refSampleEvery-th as many clean resident pages,
	// half a turn ahead of the hand, are taken away (dropped, the pool
	// holds them; or held in a local copy, counted in the budget) and a
	// fault on one before the hand reaches it is a reference.
	sigSample
	sigSampleLocal
)

const (
	damonRegion    = 16
	damonEvery     = 1024
	refSampleEvery = 4
)

// victimPolicy is what eviction asks: Victims as Clock's. A policy that
// keeps its own order (S3-FIFO) is also told of pages coming in.
type victimPolicy interface {
	Victims(tables []PageTable, out []Victim) int
}

type admitter interface {
	in(v Victim, demand bool)
}

// A policy given every access (lruPolicy) is told of each.
type toucher interface {
	touch(v Victim)
}

// agentModel replays a trace through a policy as the agent runs it.
type agentModel struct {
	tabs      []PageTable
	base      []int // first flat index of each table
	pf        []*Prefetcher
	pol       victimPolicy
	sig       signal
	noHistory bool
	budget    int
	w         Watermarks
	resident  int
	victims   []Victim
	pfOut     []int64
	res       replayResult

	sampled  []bool // taken away as a sample, not back yet
	local    []Victim
	sampleAt int // the sample hand, flat
	accessed []bool
	nAccess  int
}

func newAgentModel(tr pageTrace, budget int, pol victimPolicy, sig signal) *agentModel {
	m := &agentModel{pol: pol, sig: sig, budget: budget, w: WatermarksFor(budget),
		victims: make([]Victim, 2*budgetMargin), pfOut: make([]int64, 128)}
	n := 0
	for _, p := range tr.tables {
		m.tabs = append(m.tabs, make(PageTable, p))
		m.base = append(m.base, n)
		m.pf = append(m.pf, NewPrefetcher(32, 128))
		n += p
	}
	m.sampled, m.accessed = make([]bool, n), make([]bool, n)
	m.sampleAt = n / 2
	return m
}

func (m *agentModel) run(tr pageTrace) replayResult {
	for _, a := range tr.tr {
		m.access(a)
	}
	return m.res
}

func (m *agentModel) access(a touch) {
	p := &m.tabs[a.Table][a.Page]
	flat := m.base[a.Table] + a.Page
	if m.sig == sigDAMON {
		m.accessed[flat] = true
		if m.nAccess++; m.nAccess%damonEvery == 0 {
			m.damon()
		}
	}
	if tc, ok := m.pol.(toucher); ok && p.State() == Resident {
		tc.touch(a.Victim)
	}
	switch p.State() {
	case Resident:
		switch {
		case m.sig == sigEvery, m.sig == sigWritten && a.write:
			*p |= FlagRef
		}
		if a.write && !p.Has(FlagDirty) {
			*p |= FlagDirty | FlagRef // the WP fault
		}
		return
	case Absent:
		*p = Page(0).With(Resident) | FlagDirty | FlagRef // zero fill
		m.admit(a.Victim, true)
	case Remote:
		if m.sampled[flat] {
			m.sampled[flat] = false
			if p.Has(FlagGhost) {
				m.res.sampleFaults++
				if m.sig == sigSampleLocal {
					// Served from its local copy, in the budget all along:
					// no READ, nothing to evict.
					*p = p.FaultedIn()
					if a.write {
						*p |= FlagDirty
					}
					m.admit(a.Victim, true)
					return
				}
			} else {
				m.res.misses++
			}
		} else {
			m.res.misses++
		}
		m.res.reads++
		*p = p.FaultedIn()
		m.admit(a.Victim, true)
		m.prefetch(a.Victim)
	}
	if a.write {
		*p |= FlagDirty
	}
	m.resident++
	m.evict()
}

func (m *agentModel) admit(v Victim, demand bool) {
	if ad, ok := m.pol.(admitter); ok {
		ad.in(v, demand)
	}
}

// prefetch asks the region's real prefetcher after a demand fault on v and
// brings in what it names, within the room the budget leaves (fault.go).
func (m *agentModel) prefetch(v Victim) {
	t := m.tabs[v.Table]
	n := m.pf[v.Table].Fault(int64(v.Page), int64(len(t)), m.pfOut)
	room := m.budget + budgetMargin - m.resident - 1
	for _, q := range m.pfOut[:n] {
		if room <= 0 {
			break
		}
		if p := t[q]; p.State() == Remote && !m.sampled[m.base[v.Table]+int(q)] {
			room--
			m.res.reads++
			t[q] = p.FaultedIn()
			m.resident++
			m.admit(Victim{v.Table, int(q)}, false)
		}
	}
}

// evict takes batches of victims while resident pages are past the high
// watermark, as maybeEvict does (one batch at a time, at most
// MaxEvictBatch pages), and with each batch the samples, if sampling.
func (m *agentModel) evict() {
	for {
		need := min(m.w.ToEvict(m.resident, 0), budgetMargin)
		if need <= 0 {
			return
		}
		n := m.pol.Victims(m.tabs, m.victims[:need])
		if n == 0 {
			panic("no victim")
		}
		for _, v := range m.victims[:n] {
			q := &m.tabs[v.Table][v.Page]
			if q.Has(FlagDirty) {
				m.res.writeBacks++
			}
			*q = (*q &^ FlagBusy).Evicted(Remote)
			if m.noHistory {
				*q &^= FlagGhost // no page ever comes in hot: CLOCK as it was
			}
		}
		m.resident -= n
		switch m.sig {
		case sigSample:
			m.sample((n + refSampleEvery - 1) / refSampleEvery)
		case sigSampleLocal:
			m.freeLocal()
			m.sample((n + refSampleEvery - 1) / refSampleEvery)
		}
	}
}

// sample takes k clean resident pages away at the sample hand.
func (m *agentModel) sample(k int) {
	total := 0
	for _, t := range m.tabs {
		total += len(t)
	}
	for step := 0; step < total && k > 0; step++ {
		m.sampleAt = (m.sampleAt + 1) % total
		ti := len(m.base) - 1
		for m.base[ti] > m.sampleAt {
			ti--
		}
		q := &m.tabs[ti][m.sampleAt-m.base[ti]]
		if q.State() != Resident || q.Has(FlagDirty) || *q&(FlagBusy|FlagFetch) != 0 {
			continue
		}
		*q = q.Evicted(Remote)
		m.sampled[m.sampleAt] = true
		k--
		if m.sig == sigSampleLocal {
			m.local = append(m.local, Victim{ti, m.sampleAt - m.base[ti]})
		} else {
			m.resident--
		}
	}
}

// freeLocal lets go of the local copies of samples the hand has passed
// (their FlagGhost cleared) or that came back.
func (m *agentModel) freeLocal() {
	keep := m.local[:0]
	for _, v := range m.local {
		flat := m.base[v.Table] + v.Page
		switch p := m.tabs[v.Table][v.Page]; {
		case !m.sampled[flat]:
		case p.Has(FlagGhost):
			keep = append(keep, v)
		default:
			m.sampled[flat] = false
			m.resident--
		}
	}
	m.local = keep
}

// damon sets the reference bit of the resident pages of every region one
// of whose pages was accessed since the last look.
func (m *agentModel) damon() {
	nr := (len(m.accessed) + damonRegion - 1) / damonRegion
	region := func(flat int) int { return int(uint64(flat) * 2654435761 % uint64(nr)) }
	hit := make([]bool, nr)
	for f, a := range m.accessed {
		if a {
			hit[region(f)] = true
			m.accessed[f] = false
		}
	}
	for ti, t := range m.tabs {
		for i, p := range t {
			if p.State() == Resident && hit[region(m.base[ti]+i)] {
				t[i] = p | FlagRef
			}
		}
	}
}

// s3fifo is S3-FIFO (Yang et al., SOSP'23) over page tables: a small FIFO
// of a tenth of the pages for pages coming in, a main FIFO for pages
// referenced while in the small one or back from the ghost (pages evicted
// within the last ghost evictions), a reference bit for "accessed again".
// It sees references as the model's signal sets FlagRef, which it clears
// at admission (coming in is not a second access).
type s3fifo struct {
	small, main []Victim
	gone        map[Victim]int
	evictions   int
	ghost       int
	smallCap    int
	tabs        []PageTable
}

func newS3FIFO(tabs []PageTable, capacity int) *s3fifo {
	return &s3fifo{gone: map[Victim]int{}, ghost: capacity * 9 / 10,
		smallCap: capacity / 10, tabs: tabs}
}

func (s *s3fifo) in(v Victim, demand bool) {
	p := &s.tabs[v.Table][v.Page]
	*p &^= FlagRef
	if g, ok := s.gone[v]; ok && demand && s.evictions-g <= s.ghost {
		s.main = append(s.main, v)
		return
	}
	s.small = append(s.small, v)
}

func (s *s3fifo) Victims(tables []PageTable, out []Victim) int {
	n := 0
	for n < len(out) && len(s.small)+len(s.main) > 0 {
		fromSmall := len(s.small) > s.smallCap || len(s.main) == 0
		q := &s.main
		if fromSmall {
			q = &s.small
		}
		v := (*q)[0]
		*q = (*q)[1:]
		p := &tables[v.Table][v.Page]
		if p.State() != Resident || p.Has(FlagBusy) {
			continue
		}
		if p.Has(FlagRef) {
			*p &^= FlagRef
			s.main = append(s.main, v)
			continue
		}
		*p |= FlagBusy
		s.gone[v] = s.evictions
		s.evictions++
		out[n] = v
		n++
	}
	return n
}

// lruPolicy is LRU in the agent's model: every access moves its page to
// the front; victims come from the back.
type lruPolicy struct {
	base       []int
	prev, next []int32
	head       int32
}

func newLRUPolicy(tr pageTrace) *lruPolicy {
	n := tr.pages()
	l := &lruPolicy{prev: make([]int32, n+1), next: make([]int32, n+1), head: int32(n)}
	for i := range l.prev {
		l.prev[i], l.next[i] = -1, -1
	}
	l.prev[l.head], l.next[l.head] = l.head, l.head
	b := 0
	for _, p := range tr.tables {
		l.base = append(l.base, b)
		b += p
	}
	return l
}

func (l *lruPolicy) unlink(p int32) {
	if l.next[p] >= 0 {
		l.next[l.prev[p]], l.prev[l.next[p]] = l.next[p], l.prev[p]
		l.prev[p], l.next[p] = -1, -1
	}
}

func (l *lruPolicy) touch(v Victim) {
	p := int32(l.base[v.Table] + v.Page)
	l.unlink(p)
	l.prev[p], l.next[p] = l.head, l.next[l.head]
	l.prev[l.next[l.head]] = p
	l.next[l.head] = p
}

func (l *lruPolicy) in(v Victim, demand bool) { l.touch(v) }

func (l *lruPolicy) Victims(tables []PageTable, out []Victim) int {
	n := 0
	for p := l.prev[l.head]; p != l.head && n < len(out); {
		q := l.prev[p]
		t := len(l.base) - 1
		for l.base[t] > int(p) {
			t--
		}
		v := Victim{t, int(p) - l.base[t]}
		if e := &tables[v.Table][v.Page]; e.State() == Resident && !e.Has(FlagBusy) {
			*e |= FlagBusy
			out[n] = v
			n++
			l.unlink(p)
		}
		p = q
	}
	return n
}

// replayRow is one policy and signal of the table.
type replayRow struct {
	name string
	run  func(tr pageTrace, budget int) replayResult
}

func modelRow(name string, sig signal, pol func(tr pageTrace, budget int, tabs []PageTable) victimPolicy) replayRow {
	return replayRow{name, func(tr pageTrace, budget int) replayResult {
		m := newAgentModel(tr, budget, nil, sig)
		m.pol = pol(tr, budget, m.tabs)
		return m.run(tr)
	}}
}

func clockPolicy(tr pageTrace, budget int, tabs []PageTable) victimPolicy { return &Clock{} }

// beforeRow is CLOCK as it was before hot and cold pages: the refault
// forgotten.
func beforeRow(name string, sig signal) replayRow {
	return replayRow{name, func(tr pageTrace, budget int) replayResult {
		m := newAgentModel(tr, budget, &Clock{}, sig)
		m.noHistory = true
		return m.run(tr)
	}}
}

func s3Policy(tr pageTrace, budget int, tabs []PageTable) victimPolicy {
	return newS3FIFO(tabs, WatermarksFor(budget).High)
}

func lruRow() replayRow {
	return modelRow("LRU, every access", sigEvery, func(tr pageTrace, budget int, tabs []PageTable) victimPolicy { return newLRUPolicy(tr) })
}

func hotPctPolicy(pct int) func(tr pageTrace, budget int, tabs []PageTable) victimPolicy {
	return func(tr pageTrace, budget int, tabs []PageTable) victimPolicy { return &Clock{hotPct: pct} }
}

// replayRows are the policies and signals replayed. The row the agent
// runs is chosenRow.
var replayRows = []replayRow{
	lruRow(),
	{"Belady's optimum (demand paging)", func(tr pageTrace, budget int) replayResult {
		t := optTraffic(tr.tr, WatermarksFor(budget).High)
		return replayResult{misses: t.reads, traffic: t}
	}},
	beforeRow("CLOCK, faults (before)", sigFaults),
	beforeRow("CLOCK, every access", sigEvery),
	modelRow("S3-FIFO, refaults", sigFaults, s3Policy),
	modelRow("S3-FIFO, every access", sigEvery, s3Policy),
	modelRow("hot/cold CLOCK, refaults", sigFaults, clockPolicy),
	modelRow("hot/cold CLOCK, + sampling", sigSample, clockPolicy),
	modelRow("hot/cold CLOCK, + local samples", sigSampleLocal, clockPolicy),
	modelRow("hot/cold CLOCK, + PAGEMAP_SCAN", sigWritten, clockPolicy),
	modelRow("hot/cold CLOCK, + DAMON/16", sigDAMON, clockPolicy),
	modelRow("hot/cold CLOCK, every access", sigEvery, clockPolicy),
}

const (
	lruIdx    = 0
	beforeIdx = 2
	chosenIdx = 6
)

// replayTraces are the traces at a size that replays in a second or two:
// the bench's proportions (reads per page) at a quarter of its heap.
func replayTraces() []pageTrace {
	return []pageTrace{
		zipfTrace(8192, 65536),
		uniformTrace(8192, 65536),
		scanHotTrace(8192, 1638, 4, 4),
		{"qsort", []int{2048, 2048}, mergeSortTrace(2048)},
		redisTrace(16384, 65536, true),
		redisTrace(16384, 65536, false),
		shiftTrace(8192, 32768),
	}
}

// shiftTrace is zipfTrace's reads in two phases, the hot pages of the
// second elsewhere than those of the first: the policy must let an old
// hot set go.
func shiftTrace(n, reads int) pageTrace {
	tr := zipfTrace(n, reads)
	rng := rand.New(rand.NewSource(5))
	cdf := zipfCDF(n, 0.99)
	for range reads {
		tr.tr = append(tr.tr, touch{Victim{0, int((uint64(drawRank(cdf, rng))*2654435761 + uint64(n)/2) % uint64(n))}, false})
	}
	tr.name = "zipf, hot set moves"
	return tr
}

var replayShares = []int{75, 50, 25}

// replayBound is, per trace, the most faults (misses and sample faults)
// the chosen policy may take, over LRU's given every access, at any share:
// the replay's figures when it was chosen, plus 0.05. Zipfian reads at 75%
// stay at about 1.18x whatever the policy sees short of every access: the
// run is shorter than one turn of the hand, and each hot page a policy
// finds costs it a fault (a miss, or a sample's) either way.
var replayBound = map[string]float64{
	"zipf": 1.23, "uniform": 1.06, "scan+hot": 1.56, "qsort": 1.16,
	"redis zipf": 1.17, "redis uniform": 1.08, "zipf, hot set moves": 1.22,
}

// TestReplayPolicies replays each trace through each policy and signal at
// 75, 50 and 25% of its pages local, logs the table (go test -v -run
// TestReplayPolicies: the table of docs/pager.md, Eviction), and fails when
// the agent's policy (hot/cold CLOCK over faults and refaults) takes more
// faults than replayBound allows, or moves more than 1.1x the pages CLOCK
// did before it. Under -race it replays only the rows the checks need.
func TestReplayPolicies(t *testing.T) {
	for _, tr := range replayTraces() {
		res := make([][]replayResult, len(replayRows))
		for i, row := range replayRows {
			if raceEnabled && i != lruIdx && i != beforeIdx && i != chosenIdx {
				continue
			}
			for _, share := range replayShares {
				res[i] = append(res[i], row.run(tr, tr.pages()*share/100))
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s: %d pages, %d accesses; per share local: faults (misses+sample faults), pages moved, faults over LRU's\n", tr.name, tr.pages(), len(tr.tr))
		for i, row := range replayRows {
			if res[i] == nil {
				continue
			}
			fmt.Fprintf(&b, "  %-34s", row.name)
			for k, share := range replayShares {
				r, lru := res[i][k], res[lruIdx][k]
				f := fmt.Sprint(r.misses)
				if r.sampleFaults > 0 {
					f = fmt.Sprintf("%d+%d", r.misses, r.sampleFaults)
				}
				fmt.Fprintf(&b, " | %d%%: %10s %6d %5.2fx", share, f, r.moved(), float64(r.faults())/float64(max(lru.faults(), 1)))
			}
			b.WriteString("\n")
		}
		t.Log(b.String())
		for k, share := range replayShares {
			got, lru, before := res[chosenIdx][k], res[lruIdx][k], res[beforeIdx][k]
			if q := float64(got.faults()) / float64(max(lru.faults(), 1)); q > replayBound[tr.name] {
				t.Errorf("%s at %d%%: %d faults, %.2fx LRU's %d: want at most %.2fx", tr.name, share, got.faults(), q, lru.faults(), replayBound[tr.name])
			}
			if float64(got.moved()) > 1.1*float64(before.moved()) {
				t.Errorf("%s at %d%%: %d pages moved, CLOCK before moved %d: want at most 1.1x", tr.name, share, got.moved(), before.moved())
			}
		}
	}
}
