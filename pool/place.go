package pool

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Candidate is a server as placement sees it.
type Candidate struct {
	ID     ServerID
	Domain string // failure domain; "" means the server is its own domain
	Free   int    // free slabs
}

// Placement is the result of Place: for each new slab, the indexes (into the
// candidates given to Place) of the servers holding its replicas.
type Placement [][]int

// PlaceRequest is what to place.
type PlaceRequest struct {
	Slabs    int // number of logical slabs, ≥ 1
	Replicas int // replicas of each, ≥ 1
	// Avoid lists, per slab, servers and domains that must not be used (the
	// slab's existing replicas when placing a replacement). May be nil.
	Avoid [][]ServerID
}

// Place chooses servers for req.Slabs slabs of req.Replicas replicas each:
// the replicas of one slab go to distinct servers in distinct failure
// domains; each replica goes to the freer of two servers drawn at random
// among those that may take it (power of two choices), counting what this
// placement has already taken. It never takes more than a candidate's Free.
//
// All or nothing: if any replica cannot be placed, Place returns an error
// wrapping ErrNoCapacity and no placement. Place does not modify cands.
func Place(cands []Candidate, req PlaceRequest, rnd *rand.Rand) (Placement, error) {
	if req.Slabs < 1 || req.Replicas < 1 {
		return nil, fmt.Errorf("%w: want at least one slab and one replica (got %d slabs, %d replicas)", ErrInvalid, req.Slabs, req.Replicas)
	}
	free := make([]int, len(cands))
	total := 0
	for i := range cands {
		free[i] = max(cands[i].Free, 0)
		total += free[i]
	}
	if want := req.Slabs * req.Replicas; want > total {
		return nil, fmt.Errorf("%w: %d slabs × %d replicas need %d free slabs, the pool has %d", ErrNoCapacity, req.Slabs, req.Replicas, want, total)
	}
	p := placer{cands: cands, free: free, rnd: rnd}
	out := make(Placement, req.Slabs)
	for s := 0; s < req.Slabs; s++ {
		p.usedIDs, p.usedDoms = p.usedIDs[:0], p.usedDoms[:0]
		if s < len(req.Avoid) {
			for _, id := range req.Avoid[s] {
				p.usedIDs = append(p.usedIDs, id)
				for i := range cands { // Avoid is short and rare (replacements)
					if cands[i].ID == id && cands[i].Domain != "" {
						p.usedDoms = append(p.usedDoms, cands[i].Domain)
					}
				}
			}
		}
		out[s] = make([]int, 0, req.Replicas)
		for r := 0; r < req.Replicas; r++ {
			pick, ok := p.draw()
			if !ok {
				return nil, fmt.Errorf("%w: slab %d of %d: %s", ErrNoCapacity, s+1, req.Slabs, p.why())
			}
			if other, ok := p.draw(); ok && free[other] > free[pick] {
				pick = other
			}
			free[pick]--
			p.usedIDs = append(p.usedIDs, cands[pick].ID)
			if d := cands[pick].Domain; d != "" {
				p.usedDoms = append(p.usedDoms, d)
			}
			out[s] = append(out[s], pick)
		}
	}
	return out, nil
}

// why says why no candidate may take the current slab's next replica:
// usedIDs are the servers of its other replicas, existing ones (Avoid)
// included.
func (p *placer) why() string {
	if len(p.usedIDs) == 0 {
		return "no server with a free slab"
	}
	ids := make([]string, len(p.usedIDs))
	for i, id := range p.usedIDs {
		ids[i] = string(id)
	}
	return fmt.Sprintf("no server with a free slab that holds none of its other %d replica(s) (on %s) nor shares their failure domains",
		len(ids), strings.Join(ids, ", "))
}

// placer holds the working state of one Place call.
type placer struct {
	cands    []Candidate
	free     []int
	rnd      *rand.Rand
	usedIDs  []ServerID // servers of the current slab's replicas (and avoided ones)
	usedDoms []string   // their failure domains
	eligible []int
}

func (p *placer) ok(i int) bool {
	if p.free[i] <= 0 {
		return false
	}
	c := &p.cands[i]
	for _, id := range p.usedIDs {
		if id == c.ID {
			return false
		}
	}
	if c.Domain != "" {
		for _, d := range p.usedDoms {
			if d == c.Domain {
				return false
			}
		}
	}
	return true
}

// draw returns a uniformly random candidate that may take the replica:
// rejection sampling while eligible candidates are common, a scan when they
// are rare.
func (p *placer) draw() (int, bool) {
	for range 16 {
		if i := p.rnd.IntN(len(p.cands)); p.ok(i) {
			return i, true
		}
	}
	p.eligible = p.eligible[:0]
	for i := range p.cands {
		if p.ok(i) {
			p.eligible = append(p.eligible, i)
		}
	}
	if len(p.eligible) == 0 {
		return 0, false
	}
	return p.eligible[p.rnd.IntN(len(p.eligible))], true
}
