package pool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func cands(n, free int, domains int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = Candidate{ID: ServerID(fmt.Sprintf("s%d", i)), Free: free}
		if domains > 0 {
			out[i].Domain = fmt.Sprintf("rack%d", i%domains)
		}
	}
	return out
}

// checkPlacement verifies the invariants every placement must keep.
func checkPlacement(t *testing.T, cs []Candidate, req PlaceRequest, p Placement) {
	t.Helper()
	if len(p) != req.Slabs {
		t.Fatalf("%d slabs placed, want %d", len(p), req.Slabs)
	}
	taken := make([]int, len(cs))
	for s, reps := range p {
		if len(reps) != req.Replicas {
			t.Fatalf("slab %d has %d replicas, want %d", s, len(reps), req.Replicas)
		}
		doms := map[string]bool{}
		for _, i := range reps {
			d := "server:" + string(cs[i].ID)
			if cs[i].Domain != "" {
				d = "domain:" + cs[i].Domain
			}
			if doms[d] {
				t.Fatalf("slab %d: two replicas in %s", s, d)
			}
			doms[d] = true
			taken[i]++
		}
	}
	for i, n := range taken {
		if n > cs[i].Free {
			t.Fatalf("server %s: %d taken, only %d free", cs[i].ID, n, cs[i].Free)
		}
	}
}

func TestPlaceInvariants(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, tt := range []struct {
		servers, free, domains, slabs, replicas int
		ok                                      bool
	}{
		{3, 4, 0, 4, 3, true},
		{3, 4, 0, 5, 3, false}, // 15 > 12 free
		{5, 10, 0, 10, 2, true},
		{6, 10, 3, 10, 3, true},
		{6, 10, 2, 1, 3, false}, // only two domains
		{1, 100, 0, 50, 1, true},
		{2, 100, 0, 1, 3, false}, // three replicas, two servers
		{4, 1, 0, 2, 2, true},    // exactly full
	} {
		name := fmt.Sprintf("%d×%d/%ddom/%d×%d", tt.servers, tt.free, tt.domains, tt.slabs, tt.replicas)
		t.Run(name, func(t *testing.T) {
			cs := cands(tt.servers, tt.free, tt.domains)
			req := PlaceRequest{Slabs: tt.slabs, Replicas: tt.replicas}
			p, err := Place(cs, req, rnd)
			if !tt.ok {
				if !errors.Is(err, ErrNoCapacity) || p != nil {
					t.Fatalf("want ErrNoCapacity and no placement, got %v, %v", p, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPlacement(t, cs, req, p)
		})
	}
}

func TestPlaceAvoid(t *testing.T) {
	cs := cands(3, 10, 0)
	rnd := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		p, err := Place(cs, PlaceRequest{Slabs: 1, Replicas: 1, Avoid: [][]ServerID{{"s0", "s1"}}}, rnd)
		if err != nil {
			t.Fatal(err)
		}
		if cs[p[0][0]].ID != "s2" {
			t.Fatalf("placed on %s, want s2", cs[p[0][0]].ID)
		}
	}
	if _, err := Place(cs, PlaceRequest{Slabs: 1, Replicas: 1, Avoid: [][]ServerID{{"s0", "s1", "s2"}}}, rnd); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("all avoided: %v", err)
	}
}

// Power of two choices prefers free servers: with one nearly full server
// among empty ones, the full one gets far less than its share.
func TestPlacePrefersFree(t *testing.T) {
	cs := cands(4, 1000, 0)
	cs[0].Free = 10
	rnd := rand.New(rand.NewPCG(5, 6))
	p, err := Place(cs, PlaceRequest{Slabs: 400, Replicas: 1}, rnd)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, reps := range p {
		if reps[0] == 0 {
			n++
		}
	}
	// Uniform choice would give ~100; two choices give s0 only when both
	// draws are s0 (1/16): ~25.
	if n > 60 {
		t.Fatalf("nearly full server got %d of 400 slabs", n)
	}
}

func TestPlaceBadRequest(t *testing.T) {
	if _, err := Place(cands(2, 2, 0), PlaceRequest{Slabs: 0, Replicas: 1}, rand.New(rand.NewPCG(1, 1))); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func TestExpiredAndDead(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ls := []Lease{{ID: "b", Expires: t0}, {ID: "a", Expires: t0.Add(-time.Second)}, {ID: "c", Expires: t0.Add(time.Nanosecond)}}
	got := Expired(ls, t0)
	if fmt.Sprint(got) != "[a b]" {
		t.Fatalf("Expired = %v", got)
	}
	lv := []Liveness{
		{ID: "x", State: ServerUp, LastHeartbeat: t0.Add(-2 * time.Second)},
		{ID: "y", State: ServerUp, LastHeartbeat: t0.Add(-time.Second)},
		{ID: "z", State: ServerLeft, LastHeartbeat: t0.Add(-time.Hour)},
	}
	if d := Dead(lv, t0, time.Second); fmt.Sprint(d) != "[x]" {
		t.Fatalf("Dead = %v", d)
	}
}

func TestEventsFor(t *testing.T) {
	servers := map[ServerID]*Server{
		"up":    {ServerInfo: ServerInfo{ID: "up", Instance: "i1"}, State: ServerUp},
		"drain": {ServerInfo: ServerInfo{ID: "drain", Instance: "i1"}, State: ServerUp, Draining: true},
		"dead":  {ServerInfo: ServerInfo{ID: "dead", Instance: "i1"}, State: ServerDead},
		"boot":  {ServerInfo: ServerInfo{ID: "boot", Instance: "i2"}, State: ServerUp},
	}
	slab := &Slab{ID: 7, Replicas: []Replica{
		{Server: "up", Instance: "i1"}, {Server: "drain", Instance: "i1"},
		{Server: "dead", Instance: "i1"}, {Server: "boot", Instance: "i1"}, {Server: "gone", Instance: "i1"},
	}}
	ev := EventsFor(nil, []*Slab{slab}, func(id ServerID) *Server { return servers[id] })
	want := "[{replica-drain 7 drain 0} {replica-lost 7 dead 0} {replica-lost 7 boot 0} {replica-lost 7 gone 0}]"
	if fmt.Sprint(ev) != want {
		t.Fatalf("events %v\nwant %v", ev, want)
	}
}

func TestValidateNamesField(t *testing.T) {
	for _, tt := range []struct {
		err   error
		field string
	}{
		{(&AllocateRequest{Slabs: 0, Replicas: 1}).Validate(), "slabs"},
		{(&AllocateRequest{Slabs: 1, Replicas: 99}).Validate(), "replicas"},
		{(&CreateLeaseRequest{Agent: "", TTL: Duration(time.Second)}).Validate(), "agent"},
		{(&CreateLeaseRequest{Agent: "a", TTL: 0}).Validate(), "ttl"},
		{(&ServerInfo{ID: "s", Instance: "i", SlabSize: 100, Addrs: map[string]string{"tcp": "x"}}).Validate(), "slab_size"},
		{(&ServerInfo{ID: "a b", Instance: "i"}).Validate(), "id"},
	} {
		var fe *FieldError
		if !errors.As(tt.err, &fe) || fe.Field != tt.field || !errors.Is(tt.err, ErrInvalid) {
			t.Errorf("error %v: want a FieldError on %q", tt.err, tt.field)
		}
	}
}

// The error counts the replicas a replacement must avoid: the slab's
// existing ones, not only those placed by this call (it said "its other 0
// replica(s)" for a replacement beside a surviving replica).
func TestPlaceErrorCountsExistingReplicas(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	cs := []Candidate{{ID: "a", Free: 3}, {ID: "b", Free: 3}}
	_, err := Place(cs, PlaceRequest{Slabs: 1, Replicas: 1, Avoid: [][]ServerID{{"a", "b"}}}, rnd)
	if !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "its other 2 replica(s) (on a, b)") {
		t.Fatalf("replacement with nowhere to go: %v", err)
	}
	_, err = Place(cs, PlaceRequest{Slabs: 1, Replicas: 3}, rnd)
	if !strings.Contains(err.Error(), "its other 2 replica(s)") {
		t.Fatalf("three replicas on two servers: %v", err)
	}
}
