package pager

import (
	"testing"

	"rmem/pager/remote"
)

// A READ held back as a sample or a marker keeps its page in a slot only
// while the page is Remote: one mapped meanwhile (a held fault served from
// the page's staging slot while its READ was in the batch: resolveHeld)
// is not held back, its READ's flag cleared and no slot naming it. CI's
// state check once found such a page resident, marked sampled, its slot
// kept ("sample slot 17 kept for page 300, resident"): a later hit would
// have served the slot's bytes over the program's writes since.
func TestHoldInOnlyRemote(t *testing.T) {
	r := &region{pages: PageTable{Page(0).With(Resident) | FlagFetch | FlagRef, Page(0).With(Remote) | FlagFetch}}
	c := &client{sample: samples{buf: make([]byte, (sampleSlots+markerSlots)*pageSize)}}
	for idx := range r.pages {
		c.rd.reads = append(c.rd.reads, remote.PageOp{Buf: make([]byte, pageSize)})
		c.rd.at = append(c.rd.at, readRef{pageRef: pageRef{r, idx}, prefetch: true})
	}
	c.holdIn(0, 0)
	c.holdIn(1, 1)
	if p := r.pages[0]; p.State() != Resident || p&(FlagFetch|FlagSampled) != 0 || c.sample.owner[0] != (pageRef{}) {
		t.Errorf("a page mapped meanwhile: entry %#x, slot 0 names %+v; want resident, neither fetched nor sampled, slot empty", uint16(p), c.sample.owner[0])
	}
	if p := r.pages[1]; p.State() != Remote || p&FlagFetch != 0 || !p.Has(FlagSampled) || c.sample.owner[1] != (pageRef{r, 1}) {
		t.Errorf("a Remote page: entry %#x, slot 1 names %+v; want it held back there", uint16(p), c.sample.owner[1])
	}
}
