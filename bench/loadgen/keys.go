package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Keys draws key indexes in [0, n). Implementations are immutable after
// construction: the connections share one and each brings its own source
// of randomness (a *rand.Rand seeded per connection).
type Keys interface {
	Next(r *rand.Rand) uint64
}

// Uniform draws every key with the same probability.
type Uniform struct{ N uint64 }

// Next returns a key index in [0, u.N).
func (u Uniform) Next(r *rand.Rand) uint64 { return r.Uint64N(u.N) }

// Zipf draws ranks from a Zipfian distribution over n items, P(rank i) ∝
// 1/(i+1)^theta with 0 < theta < 1, by Gray et al.'s method ("Quickly
// generating billion-record synthetic databases", SIGMOD'94), as YCSB's
// ZipfianGenerator does: exact for ranks 0 and 1, an approximation of the
// cumulative distribution above. (math/rand/v2's Zipf needs an exponent
// above 1.) Construction sums n terms once.
type Zipf struct {
	n                  uint64
	theta, alpha, zeta float64
	eta, half          float64
}

// NewZipf returns the distribution over n ≥ 2 items with exponent theta in
// (0, 1); YCSB's default theta is 0.99.
func NewZipf(n uint64, theta float64) (*Zipf, error) {
	if n < 2 {
		return nil, fmt.Errorf("loadgen: zipf over %d items: need at least 2", n)
	}
	if !(theta > 0 && theta < 1) {
		return nil, fmt.Errorf("loadgen: zipf theta %v: need 0 < theta < 1", theta)
	}
	z := &Zipf{n: n, theta: theta, alpha: 1 / (1 - theta), zeta: zeta(n, theta), half: math.Pow(0.5, theta)}
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta(2, theta)/z.zeta)
	return z, nil
}

func zeta(n uint64, theta float64) float64 {
	var s float64
	for i := uint64(1); i <= n; i++ {
		s += 1 / math.Pow(float64(i), theta)
	}
	return s
}

// Next returns a rank in [0, n): 0 is the most popular.
func (z *Zipf) Next(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zeta
	if uz < 1 {
		return 0
	}
	if uz < 1+z.half {
		return 1
	}
	return min(uint64(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
}

// Scrambled maps the ranks of a distribution through a fixed permutation
// of the keys, so that popular keys are scattered over the key space (and
// over the server's memory, which is filled in key order) instead of
// being the first ones loaded. Unlike YCSB's hashing, a permutation keeps
// the distribution exact.
type Scrambled struct {
	Ranks Keys
	perm  []uint32
}

// NewScrambled returns ranks drawn from d over n keys (n < 2³²), permuted
// by a shuffle seeded with seed.
func NewScrambled(d Keys, n uint64, seed uint64) *Scrambled {
	perm := make([]uint32, n)
	for i := range perm {
		perm[i] = uint32(i)
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	r.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	return &Scrambled{Ranks: d, perm: perm}
}

// Next returns the key of the rank d draws.
func (s *Scrambled) Next(r *rand.Rand) uint64 { return uint64(s.perm[s.Ranks.Next(r)]) }
