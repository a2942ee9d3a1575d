package pool

import (
	"fmt"
	"strconv"
	"strings"
)

// Redundancy is how an agent keeps its pages in the pool: Copies whole
// copies of each slab (rep:N), or erasure-coded stripes of K data and M
// parity shards on K+M servers (ec:K+M), which survive M lost servers at
// (K+M)/K the bytes instead of M+1 times.
type Redundancy struct {
	Copies int // rep:N; 0 under ec
	K, M   int // ec:K+M; 0 under rep
}

// Limits of ec:K+M: the shards of a slab are its replicas, MaxReplicas at
// most; one parity shard at least.
const maxShards = MaxReplicas

// ParseRedundancy reads "rep:N" (1..MaxReplicas) or "ec:K+M" (K >= 1,
// M >= 1, K+M <= MaxReplicas).
func ParseRedundancy(s string) (Redundancy, error) {
	kind, arg, ok := strings.Cut(strings.TrimSpace(s), ":")
	switch {
	case ok && kind == "rep":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 || n > MaxReplicas {
			return Redundancy{}, fmt.Errorf("redundancy %q: want rep:N with N from 1 to %d", s, MaxReplicas)
		}
		return Redundancy{Copies: n}, nil
	case ok && kind == "ec":
		ks, ms, _ := strings.Cut(arg, "+")
		k, err1 := strconv.Atoi(ks)
		m, err2 := strconv.Atoi(ms)
		if err1 != nil || err2 != nil || k < 1 || m < 1 || k+m > maxShards {
			return Redundancy{}, fmt.Errorf("redundancy %q: want ec:K+M with K, M >= 1 and K+M <= %d", s, maxShards)
		}
		return Redundancy{K: k, M: m}, nil
	}
	return Redundancy{}, fmt.Errorf("redundancy %q: want rep:N or ec:K+M", s)
}

// String is the form ParseRedundancy reads.
func (r Redundancy) String() string {
	if r.M > 0 {
		return fmt.Sprintf("ec:%d+%d", r.K, r.M)
	}
	return fmt.Sprintf("rep:%d", r.Copies)
}

// EC reports whether r erasure-codes.
func (r Redundancy) EC() bool { return r.M > 0 }

// Servers is how many distinct servers a slab of r takes.
func (r Redundancy) Servers() int {
	if r.EC() {
		return r.K + r.M
	}
	return r.Copies
}

// Tolerates is how many lost servers a slab of r survives.
func (r Redundancy) Tolerates() int {
	if r.EC() {
		return r.M
	}
	return r.Copies - 1
}

// StripeLayout reads a Layout "stripe:K" (AllocateRequest.Layout), ok
// false for any other; K < 1 if it does not parse.
func StripeLayout(layout string) (k int, ok bool) {
	arg, ok := strings.CutPrefix(layout, "stripe:")
	if !ok {
		return 0, false
	}
	k, err := strconv.Atoi(arg)
	if err != nil {
		return -1, true
	}
	return k, true
}
