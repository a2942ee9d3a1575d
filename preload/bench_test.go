package preload

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkShimAlloc measures what the min-alloc threshold trades: the
// cost of malloc(size)+free, untouched and with every page written once,
// under the shim (a region: mmap, UFFDIO_REGISTER, REGION_ADD round trip,
// then one agent-served fault per page) against glibc in the same run.
// The agent here is the test agent (a Go loop with channels), slower per
// fault than memagent; the region cost is the "untouched" line.
//
//	go test -run '^$' -bench ShimAlloc -benchtime 200x ./preload/
func BenchmarkShimAlloc(b *testing.B) {
	for _, size := range []int{256 << 10, 1 << 20, 4 << 20, 16 << 20} {
		for _, touch := range []int{0, 1} {
			name := fmt.Sprintf("size=%dKiB/touch=%d", size>>10, touch)
			b.Run(name, func(b *testing.B) {
				needUFFD(b)
				a := newTestAgent(b)
				args := []string{"bench", strconv.Itoa(size), strconv.Itoa(b.N), strconv.Itoa(touch)}
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
