package pool

import (
	"fmt"
	"math/rand/v2"
)

// Candidate is a server as placement sees it.
type Candidate struct {
	ID     ServerID
	Domain string // failure domain; "" means the server is its own domain
	Free   int    // free slabs
}

func (c *Candidate) domain() string {
	if c.Domain == "" {
		return "server:" + string(c.ID)
	}
	return "domain:" + c.Domain
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
	total := 0
	for i := range cands {
		total += max(cands[i].Free, 0)
	}
	if want := req.Slabs * req.Replicas; want > total {
		return nil, fmt.Errorf("%w: %d slabs × %d replicas need %d free slabs, the pool has %d", ErrNoCapacity, req.Slabs, req.Replicas, want, total)
	}
	byID := make(map[ServerID]int, len(cands))
	for i := range cands {
		byID[cands[i].ID] = i
	}
	free := make([]int, len(cands))
	for i := range cands {
		free[i] = max(cands[i].Free, 0)
	}
	out := make(Placement, req.Slabs)
	eligible := make([]int, 0, len(cands))
	usedDomains := make(map[string]bool, req.Replicas*2)
	for s := 0; s < req.Slabs; s++ {
		clear(usedDomains)
		if s < len(req.Avoid) {
			for _, id := range req.Avoid[s] {
				usedDomains["server:"+string(id)] = true
				if i, ok := byID[id]; ok {
					usedDomains[cands[i].domain()] = true
				}
			}
		}
		out[s] = make([]int, 0, req.Replicas)
		for r := 0; r < req.Replicas; r++ {
			eligible = eligible[:0]
			for i := range cands {
				if free[i] > 0 && !usedDomains[cands[i].domain()] && !usedDomains["server:"+string(cands[i].ID)] {
					eligible = append(eligible, i)
				}
			}
			if len(eligible) == 0 {
				return nil, fmt.Errorf("%w: slab %d of %d: no server with a free slab outside the failure domains of its other %d replica(s)", ErrNoCapacity, s+1, req.Slabs, r)
			}
			pick := eligible[rnd.IntN(len(eligible))]
			if len(eligible) > 1 {
				other := eligible[rnd.IntN(len(eligible))]
				if free[other] > free[pick] {
					pick = other
				}
			}
			free[pick]--
			usedDomains[cands[pick].domain()] = true
			usedDomains["server:"+string(cands[pick].ID)] = true
			out[s] = append(out[s], pick)
		}
	}
	return out, nil
}
