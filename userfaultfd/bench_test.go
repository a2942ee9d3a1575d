package userfaultfd

import (
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkFault measures fault-to-resume latency in the faulting process:
//
//	anon-first-touch   a plain anonymous first-touch fault (no uffd)
//	copy-cross-process a MISSING fault served by Copy of one page from
//	                   another process (this one), uffd passed over a socket
//	copy-batch16/64    the same, resolving 16 or 64 pages per fault
//
// Each served variant also times plain first-touch faults in the same
// child, just before, and reports p50-vs-anon = served p50 / plain p50.
// Run: go test -run '^$' -bench Fault -benchtime 20000x ./userfaultfd/
func BenchmarkFault(b *testing.B) {
	b.Run("anon-first-touch", func(b *testing.B) {
		const window = 16384
		lat := benchTouch(childSpec{Pages: window, Batch: 1, Faults: b.N}, nil)
		reportLatency(b, lat, 1, sum(lat))
	})
	for _, tc := range []struct {
		name  string
		batch int
	}{{"copy-cross-process", 1}, {"copy-batch16", 16}, {"copy-batch64", 64}} {
		b.Run(tc.name, func(b *testing.B) {
			skipUnlessFeatures(b, 0)
			benchServed(b, tc.batch)
		})
	}
}

func benchServed(b *testing.B, batch int) {
	spec := childSpec{Scenario: "bench", Memory: "anon", Mode: ModeMissing, Pages: 16384, Batch: batch, Faults: b.N}
	c := startChild(b, spec)
	u := c.uffd(b, spec)
	base := Addr(c.hello.Addr)
	src := make([]byte, batch*ps)
	for i := range src {
		src[i] = byte(i / ps)
	}
	block := uint64(batch) * PageSize
	served := 0
	stop := serve(b, u, func(ev Event) error {
		served++
		start := base + (ev.Addr - base).RoundDown(block)
		_, err := u.Copy(start, src, 0)
		if IsExist(err) {
			err = u.Wake(Range{ev.Addr.RoundDown(PageSize), PageSize})
		}
		return err
	})
	b.ResetTimer()
	c.send(b, 'g')
	res := c.result(b)
	b.StopTimer()
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	if served != len(res.Latency) {
		b.Errorf("served %d faults, the child timed %d", served, len(res.Latency))
	}
	reportLatency(b, res.Latency, batch, res.Elapsed)
	if len(res.Baseline) > 0 {
		ratio := float64(percentile(res.Latency, 50)) / float64(percentile(res.Baseline, 50))
		b.ReportMetric(ratio, "p50-vs-anon")
		b.ReportMetric(float64(percentile(res.Baseline, 50))/1e3, "anon-p50-µs")
	}
}

func reportLatency(b *testing.B, lat []int64, batch int, elapsed int64) {
	if len(lat) == 0 || elapsed <= 0 {
		return
	}
	b.ReportMetric(float64(percentile(lat, 50))/1e3, "p50-µs")
	b.ReportMetric(float64(percentile(lat, 99))/1e3, "p99-µs")
	secs := time.Duration(elapsed).Seconds()
	b.ReportMetric(float64(len(lat))/secs, "faults/s")
	b.ReportMetric(float64(len(lat)*batch)/secs, "pages/s")
}

func percentile(v []int64, p int) int64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func sum(v []int64) int64 {
	var t int64
	for _, x := range v {
		t += x
	}
	return t
}

// BenchmarkResolveIoctl measures the cost of the ioctls alone, per page,
// without any waiting thread (the pages are populated by the ioctl).
func BenchmarkResolveIoctl(b *testing.B) {
	for _, op := range []string{"copy", "zeropage"} {
		for _, batch := range []int{1, 16, 64} {
			b.Run(op+"-"+itoa(batch), func(b *testing.B) {
				u := openOrSkip(b, 0)
				const window = 16384
				region := mmapAnon(b, window*ps)
				r := Range{AddrOf(region), uint64(len(region))}
				if _, err := u.Register(r, ModeMissing); err != nil {
					b.Fatal(err)
				}
				src := make([]byte, batch*ps)
				off := 0
				b.ResetTimer()
				for range b.N {
					if off+batch > window {
						b.StopTimer()
						unix.Madvise(region, unix.MADV_DONTNEED)
						off = 0
						b.StartTimer()
					}
					a := r.Start + Addr(off*ps)
					var err error
					if op == "copy" {
						_, err = u.Copy(a, src, DontWake)
					} else {
						_, err = u.ZeroPage(Range{a, uint64(batch * ps)}, DontWake)
					}
					if err != nil {
						b.Fatal(err)
					}
					off += batch
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/page")
			})
		}
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
