package pool

import (
	"testing"
)

func TestParseRedundancy(t *testing.T) {
	for in, want := range map[string]Redundancy{
		"rep:1": {Copies: 1}, "rep:8": {Copies: 8}, " ec:6+2 ": {K: 6, M: 2}, "ec:1+1": {K: 1, M: 1}, "ec:4+4": {K: 4, M: 4},
	} {
		got, err := ParseRedundancy(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "rep", "rep:0", "rep:9", "ec:6", "ec:6+0", "ec:0+2", "ec:7+2", "ec:-1+3", "raid:5", "ec:6+2+1", "rep:2x"} {
		if got, err := ParseRedundancy(in); err == nil {
			t.Errorf("%q: accepted as %+v", in, got)
		}
	}
	if r := (Redundancy{K: 6, M: 2}); r.Servers() != 8 || r.Tolerates() != 2 || !r.EC() {
		t.Errorf("ec:6+2: servers %d tolerates %d", r.Servers(), r.Tolerates())
	}
	if r := (Redundancy{Copies: 3}); r.Servers() != 3 || r.Tolerates() != 2 || r.EC() {
		t.Errorf("rep:3: servers %d tolerates %d", r.Servers(), r.Tolerates())
	}
}

// A layout from the outside (flags, the pool's store): read or refused
// with an error, never out of bounds; what is read prints back to itself.
func FuzzParseRedundancy(f *testing.F) {
	for _, s := range []string{"rep:2", "ec:6+2", "ec:1+7", "stripe:6", "ec:+", "rep:-1", "ec:99999999999999999999+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRedundancy(s)
		if err == nil {
			if r.Servers() < 1 || r.Servers() > MaxReplicas || r.Tolerates() < 0 {
				t.Fatalf("%q: %+v", s, r)
			}
			if back, err := ParseRedundancy(r.String()); err != nil || back != r {
				t.Fatalf("%q: %+v prints as %q, read back %+v %v", s, r, r.String(), back, err)
			}
		}
		if k, ok := StripeLayout(s); ok && k >= 1 {
			req := AllocateRequest{Slabs: k, Replicas: 3, Layout: s}
			if req.Validate() != nil && k <= MaxSlabsPerRequest {
				t.Fatalf("%q: a unit of %d slabs refused", s, k)
			}
		}
	})
}
