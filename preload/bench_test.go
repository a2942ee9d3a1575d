package preload

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkShimAlloc measures malloc(size)+free under the shim (glibc
// mode: the embedded jemalloc, its heap paged by the test agent) against
// glibc in the same run, untouched and with every page written once. Small
// blocks never reach the agent. From jemalloc's oversize threshold (8 MiB)
// a free purges the block at once, a REGION_ZAP round trip, and the next
// one faults its pages through the agent again (~60 us each with this Go
// test agent, slower than memagent): those runs are capped at 20 rounds.
// Measured (2-vCPU VM, busy, ns per malloc+free, glibc / shim): 56 B
// 7-16 / 9-14, 4 KiB 16-25 / 10-20, 64 KiB 27 / 230 (jemalloc's large
// path), 1 MiB 14 / 250, 16 MiB 16 / 169,000 (the purge); 1 MiB written
// 2,500 / 3,600.
//
//	go test -run '^$' -bench ShimAlloc -benchtime 20000x ./preload/
func BenchmarkShimAlloc(b *testing.B) {
	for _, size := range []int{56, 4 << 10, 64 << 10, 1 << 20, 16 << 20} {
		for _, touch := range []int{0, 1} {
			name := fmt.Sprintf("size=%dB/touch=%d", size, touch)
			b.Run(name, func(b *testing.B) {
				needUFFD(b)
				a := newTestAgent(b)
				n := b.N
				if size >= 8<<20 {
					n = min(n, 20)
				}
				args := []string{"bench", strconv.Itoa(size), strconv.Itoa(n), strconv.Itoa(touch)}
				shim := runBench(b, a.path, args, true)
				libc := runBench(b, a.path, args, false)
				b.ReportMetric(shim, "shim-ns/op")
				b.ReportMetric(libc, "libc-ns/op")
				b.ReportMetric(shim/libc, "shim/libc")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

func runBench(b *testing.B, sock string, args []string, shim bool) float64 {
	b.Helper()
	env := []string{}
	if !shim {
		env = append(env, "LD_PRELOAD=")
	}
	p := start(b, sock, append([]string{}, args...), env...)
	l := p.Expect("ns ")
	p.Wait()
	v, err := strconv.ParseFloat(strings.TrimPrefix(l, "ns "), 64)
	if err != nil {
		b.Fatal(err)
	}
	return v
}
