package loadgen

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestZipfShape(t *testing.T) {
	const n, theta, draws = 1000, 0.99, 2_000_000
	z, err := NewZipf(n, theta)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	count := make([]float64, n)
	for range draws {
		k := z.Next(r)
		if k >= n {
			t.Fatalf("rank %d out of [0, %d)", k, n)
		}
		count[k]++
	}
	exact := func(i int) float64 { return 1 / math.Pow(float64(i+1), theta) / zeta(n, theta) }
	// Gray et al.'s method is exact for the two first ranks.
	for i := range 2 {
		if got, want := count[i]/draws, exact(i); math.Abs(got-want) > 0.02*want {
			t.Errorf("P(rank %d) = %.5f, want %.5f", i, got, want)
		}
	}
	// Above, it approximates the cumulative distribution (YCSB's too):
	// within 0.025 of the exact one here.
	var cdf, exactCDF float64
	for i := range n {
		cdf += count[i] / draws
		exactCDF += exact(i)
		if i == 9 || i == 99 || i == 499 {
			if math.Abs(cdf-exactCDF) > 0.025 {
				t.Errorf("P(rank ≤ %d) = %.4f, want %.4f", i, cdf, exactCDF)
			}
		}
	}
	// And the decay is theta's: ten times the rank, 10^0.99 times rarer
	// (ranks 10-19 against 100-199, to have counts enough).
	var a, b float64
	for i := range 10 {
		a += count[10+i]
	}
	for i := range 100 {
		b += count[100+i]
	}
	if ratio, want := a/(b/10), math.Pow(10, theta); math.Abs(ratio-want) > 0.15*want {
		t.Errorf("rank 10s over rank 100s: %.2f, want %.2f", ratio, want)
	}
}

func TestZipfDeterministic(t *testing.T) {
	z, _ := NewZipf(216_000, 0.99)
	a, b := rand.New(rand.NewPCG(7, 0)), rand.New(rand.NewPCG(7, 0))
	for range 1000 {
		if x, y := z.Next(a), z.Next(b); x != y {
			t.Fatalf("same seed, ranks %d and %d", x, y)
		}
	}
}

func TestZipfArgs(t *testing.T) {
	for _, c := range []struct {
		n     uint64
		theta float64
	}{{1, 0.99}, {100, 0}, {100, 1}, {100, 1.5}, {100, math.NaN()}} {
		if _, err := NewZipf(c.n, c.theta); err == nil {
			t.Errorf("NewZipf(%d, %v): no error", c.n, c.theta)
		}
	}
}

func TestUniformShape(t *testing.T) {
	const n, draws = 100, 1_000_000
	r := rand.New(rand.NewPCG(3, 4))
	count := make([]int, n)
	for range draws {
		count[Uniform{N: n}.Next(r)]++
	}
	for i, c := range count {
		if math.Abs(float64(c)-draws/n) > 0.05*draws/n { // 5σ
			t.Errorf("key %d drawn %d times, want about %d", i, c, draws/n)
		}
	}
}

func TestScrambled(t *testing.T) {
	const n = 10_000
	z, _ := NewZipf(n, 0.99)
	s := NewScrambled(z, n, 42)
	seen := make([]bool, n)
	for _, k := range s.perm {
		if seen[k] {
			t.Fatalf("key %d twice in the permutation", k)
		}
		seen[k] = true
	}
	if s2 := NewScrambled(z, n, 42); s2.perm[0] != s.perm[0] || s2.perm[n-1] != s.perm[n-1] {
		t.Error("the same seed gave another permutation")
	}
	// The most popular key is rank 0's, wherever the permutation put it.
	r := rand.New(rand.NewPCG(5, 6))
	count := make([]int, n)
	for range 200_000 {
		count[s.Next(r)]++
	}
	top := 0
	for k, c := range count {
		if c > count[top] {
			top = k
		}
	}
	if top != int(s.perm[0]) {
		t.Errorf("most drawn key %d, want rank 0's key %d", top, s.perm[0])
	}
	if s.perm[0] == 0 && s.perm[1] == 1 {
		t.Error("the permutation left the first ranks in place")
	}
}
