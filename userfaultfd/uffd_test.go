package userfaultfd

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

var ps = int(PageSize)

func TestOpenFeatures(t *testing.T) {
	u := openOrSkip(t, 0)
	if u.Ioctls()&(IoctlRegister|IoctlUnregister|IoctlAPI) != IoctlRegister|IoctlUnregister|IoctlAPI {
		t.Errorf("fd ioctls %v lack REGISTER/UNREGISTER/API", u.Ioctls())
	}
	t.Logf("kernel offers %v", u.Available())
	_, err := Open(1 << 62)
	if !errors.Is(err, ErrFeature) || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("unknown feature: err = %v, want ErrFeature wrapping EINVAL", err)
	}
	if got := err.Error(); !contains(got, "bit62") {
		t.Errorf("error %q does not name the missing feature", got)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// touchBySyscall makes the kernel read each page of region (write(2) to a
// pipe) on a locked OS thread, so faults happen in a system call and never
// inside Go code, and returns what the pipe delivered.
func touchBySyscall(t *testing.T, region []byte) ([]byte, error) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(region))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(p[0], buf)
			if n <= 0 || err != nil {
				return
			}
			got = append(got, buf[:n]...)
		}
	}()
	runtime.LockOSThread()
	var werr error
	for off := 0; off < len(region); off += ps {
		if _, werr = unix.Write(p[1], region[off:off+ps]); werr != nil {
			break
		}
	}
	runtime.UnlockOSThread()
	unix.Close(p[1])
	wg.Wait()
	unix.Close(p[0])
	return got, werr
}

// serve runs a Poller on u until the returned stop function is called; it
// calls fault for each page fault and fails the test on other events.
func serve(t testing.TB, u *UFFD, fault func(ev Event) error) (stop func() error) {
	t.Helper()
	p, err := NewPoller(u)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // as a pager's fault thread would
		defer runtime.UnlockOSThread()
		msgs := make([]Msg, 16)
		errc <- p.Run(ctx, msgs, func(batch []Msg) error {
			for i := range batch {
				ev, err := batch[i].Decode()
				if err != nil {
					return err
				}
				if ev.Kind != EventPagefault {
					return errors.New("unexpected event " + ev.Kind.String())
				}
				if err := fault(ev); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	return func() error {
		cancel()
		err := <-errc
		p.Close()
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
}

func TestSameProcessCopyAndZeroPage(t *testing.T) {
	defer goleak.VerifyNone(t)
	u := openOrSkip(t, FeatureThreadID)
	const pages = 64
	region := mmapAnon(t, pages*ps)
	base := AddrOf(region)
	ioctls, err := u.Register(Range{base, uint64(len(region))}, ModeMissing)
	if err != nil {
		t.Fatal(err)
	}
	if !ioctls.Has(IoctlCopy | IoctlZeroPage | IoctlWake) {
		t.Fatalf("range ioctls %v", ioctls)
	}
	src := make([]byte, ps)
	var faults, tids int
	stop := serve(t, u, func(ev Event) error {
		faults++
		if ev.TID != 0 {
			tids++
		}
		idx := uint64(ev.Addr-base) / PageSize
		if idx%4 == 0 {
			_, err := u.ZeroPage(Range{ev.Addr, PageSize}, 0)
			return err
		}
		fillPattern(src, idx, 0)
		_, err := u.Copy(ev.Addr, src, 0)
		return err
	})
	got, werr := touchBySyscall(t, region)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if werr != nil {
		t.Fatal(werr)
	}
	if len(got) != len(region) {
		t.Fatalf("read back %d bytes, want %d", len(got), len(region))
	}
	for i := range pages {
		p := got[i*ps : (i+1)*ps]
		if i%4 == 0 {
			if !isZero(p) {
				t.Errorf("page %d: not zero", i)
			}
		} else if w := checkPattern(p, uint64(i), 0); w >= 0 {
			t.Errorf("page %d: word %d differs", i, w)
		}
	}
	if faults != pages || tids != pages {
		t.Errorf("%d faults (%d with a thread id), want %d", faults, tids, pages)
	}
}

func TestRepeatedCopyIsExist(t *testing.T) {
	u := openOrSkip(t, 0)
	region := mmapAnon(t, 8*ps)
	base := AddrOf(region)
	if _, err := u.Register(Range{base, uint64(len(region))}, ModeMissing); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 4*ps)
	if n, err := u.Copy(base+Addr(2*ps), src[:ps], 0); err != nil || n != ps {
		t.Fatalf("first copy: %d, %v", n, err)
	}
	_, err := u.Copy(base+Addr(2*ps), src[:ps], 0)
	if !IsExist(err) {
		t.Fatalf("repeated copy: %v, want EEXIST", err)
	}
	if err := u.Wake(Range{base + Addr(2*ps), PageSize}); err != nil {
		t.Fatalf("wake after EEXIST: %v", err)
	}
	// A batch that runs into the populated page stops there and reports
	// how far it got.
	n, err := u.Copy(base, src, 0)
	var oe *OpError
	if !errors.As(err, &oe) || !IsMMChanged(err) || n != 2*ps || oe.Done != int64(2*ps) {
		t.Fatalf("partial batch: n=%d err=%v, want %d bytes and EAGAIN", n, err, 2*ps)
	}
	// ZeroPage on a populated page: EEXIST too.
	if _, err := u.ZeroPage(Range{base, PageSize}, 0); !IsExist(err) {
		t.Fatalf("zeropage on populated page: %v", err)
	}
	// Bad input is refused before the kernel sees it.
	if _, err := u.Copy(base+1, src[:ps], 0); !errors.Is(err, ErrRange) {
		t.Errorf("unaligned copy: %v", err)
	}
	if _, err := u.Copy(base, src[:ps], AllowSrcHoles); !errors.Is(err, unix.EINVAL) {
		t.Errorf("copy with a move flag: %v", err)
	}
}

func TestHotPathAllocs(t *testing.T) {
	u := openOrSkip(t, 0)
	const pages = 512
	region := mmapAnon(t, pages*ps)
	base := AddrOf(region)
	r := Range{base, uint64(len(region))}
	if _, err := u.Register(r, ModeMissing); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, ps)
	next := 0
	if n := testing.AllocsPerRun(100, func() {
		if _, err := u.Copy(base+Addr(next*ps), src, DontWake); err != nil {
			t.Fatal(err)
		}
		next++
	}); n != 0 {
		t.Errorf("Copy: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := u.ZeroPage(Range{base + Addr(next*ps), PageSize}, DontWake); err != nil {
			t.Fatal(err)
		}
		next++
	}); n != 0 {
		t.Errorf("ZeroPage: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := u.Wake(r); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Wake: %v allocs", n)
	}
	msgs := make([]Msg, 8)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := u.ReadEvents(msgs); err != unix.EAGAIN {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("ReadEvents: %v allocs", n)
	}
}

func TestContinueMinor(t *testing.T) {
	defer goleak.VerifyNone(t)
	u := openOrSkip(t, FeatureMinorShmem)
	const pages = 16
	mfd, err := unix.MemfdCreate("uffd-minor", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, int64(pages*ps)); err != nil {
		t.Fatal(err)
	}
	served, err := unix.Mmap(mfd, 0, pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(served)
	// Populate the page cache through the file, never through the mapping.
	page := make([]byte, ps)
	for i := range pages {
		fillPattern(page, uint64(i), 7)
		if _, err := unix.Pwrite(mfd, page, int64(i*ps)); err != nil {
			t.Fatal(err)
		}
	}
	base := AddrOf(served)
	ioctls, err := u.Register(Range{base, uint64(len(served))}, ModeMinor)
	if err != nil {
		t.Fatal(err)
	}
	if !ioctls.Has(IoctlContinue) {
		t.Fatalf("range ioctls %v lack CONTINUE", ioctls)
	}
	minor := 0
	stop := serve(t, u, func(ev Event) error {
		if ev.Flags&FaultMinor != 0 {
			minor++
		}
		_, err := u.Continue(Range{ev.Addr.RoundDown(PageSize), PageSize}, 0)
		return err
	})
	got, werr := touchBySyscall(t, served)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if werr != nil {
		t.Fatal(werr)
	}
	for i := range pages {
		if w := checkPattern(got[i*ps:(i+1)*ps], uint64(i), 7); w >= 0 {
			t.Errorf("page %d word %d differs", i, w)
		}
	}
	if minor != pages {
		t.Errorf("%d minor faults, want %d", minor, pages)
	}
}

func TestMoveAndPoison(t *testing.T) {
	defer goleak.VerifyNone(t)
	u := openOrSkip(t, FeatureMove|FeaturePoison)
	const pages = 8
	dst := mmapAnon(t, pages*ps)
	src := mmapAnon(t, pages*ps)
	for i := range pages {
		fillPattern(src[i*ps:(i+1)*ps], uint64(i), 3)
	}
	base := AddrOf(dst)
	ioctls, err := u.Register(Range{base, uint64(len(dst))}, ModeMissing)
	if err != nil {
		t.Fatal(err)
	}
	if !ioctls.Has(IoctlMove | IoctlPoison) {
		t.Fatalf("range ioctls %v lack MOVE|POISON", ioctls)
	}
	const poisoned = 5
	stop := serve(t, u, func(ev Event) error {
		off := uint64(ev.Addr - base)
		if off/PageSize == poisoned {
			_, err := u.Poison(Range{ev.Addr, PageSize}, 0)
			return err
		}
		_, err := u.Move(ev.Addr, AddrOf(src)+Addr(off), PageSize, 0)
		return err
	})
	got, werr := touchBySyscall(t, dst[:poisoned*ps])
	_, perr := touchBySyscall(t, dst[poisoned*ps:(poisoned+1)*ps])
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if werr != nil {
		t.Fatal(werr)
	}
	for i := range poisoned {
		if w := checkPattern(got[i*ps:(i+1)*ps], uint64(i), 3); w >= 0 {
			t.Errorf("moved page %d word %d differs", i, w)
		}
		if !isZero(src[i*ps : (i+1)*ps]) { // moved away: the source is empty
			t.Errorf("source page %d still populated after move", i)
		}
	}
	if !errors.Is(perr, unix.EFAULT) {
		t.Errorf("reading a poisoned page: %v, want EFAULT", perr)
	}
}

func TestPollerStops(t *testing.T) {
	defer goleak.VerifyNone(t)
	u := openOrSkip(t, 0)

	// Stop ends a blocked Wait.
	p, err := NewPoller(u)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewPoller(u); err == nil {
		t.Fatal("second poller on one UFFD accepted")
	}
	msgs := make([]Msg, 4)
	errc := make(chan error)
	go func() { _, err := p.Wait(msgs); errc <- err }()
	time.Sleep(10 * time.Millisecond) // let it block in poll (not required for correctness)
	p.Stop()
	if err := <-errc; !errors.Is(err, ErrStopped) {
		t.Fatalf("Wait after Stop: %v", err)
	}
	if _, err := p.Wait(msgs); !errors.Is(err, ErrStopped) {
		t.Fatalf("Wait on a stopped poller: %v", err)
	}
	p.Close()
	p.Close()
	if _, err := p.Wait(msgs); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait on a closed poller: %v", err)
	}

	// Context cancellation ends Run.
	p, err = NewPoller(u)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { errc <- p.Run(ctx, msgs, func([]Msg) error { return nil }) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel: %v", err)
	}
	p.Close()

	// UFFD.Close ends Run.
	p, err = NewPoller(u)
	if err != nil {
		t.Fatal(err)
	}
	go func() { errc <- p.Run(context.Background(), msgs, func([]Msg) error { return nil }) }()
	time.Sleep(10 * time.Millisecond)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrStopped) {
		t.Fatalf("Run after UFFD.Close: %v", err)
	}
	p.Close()
	u.Close()
}

func TestDirtyTrackingAsync(t *testing.T) {
	u := openOrSkip(t, FeatureWPAsync)
	if !u.Features().Has(FeatureWPUnpopulated) {
		t.Errorf("features %v: WP_ASYNC implies WP_UNPOPULATED", u.Features())
	}
	const pages = 1024
	region := mmapAnon(t, pages*ps)
	r := Range{AddrOf(region), uint64(len(region))}
	if _, err := u.Register(r, ModeWP); err != nil {
		t.Fatal(err)
	}
	if err := u.WriteProtect(r); err != nil {
		t.Fatal(err)
	}
	s, err := OpenDirtyScanner(0, 16) // small vector: exercises walk_end
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []Range
	if got, err = s.Scan(r, got[:0]); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("fresh protected range reports written pages %v", got)
	}
	rng := newRand(1)
	for round := range 8 {
		// Writes from Go code are fine here: with WP_ASYNC the kernel
		// resolves them and no thread waits for us.
		want := make(map[int]bool)
		for range 1 + rng.intn(300) {
			i := rng.intn(pages)
			want[i] = true
			region[i*ps+rng.intn(ps)] = byte(round + 1)
		}
		if round == 3 { // a long run, to cross vector boundaries as one range
			for i := 100; i < 400; i++ {
				want[i] = true
				region[i*ps] = 1
			}
		}
		got, err = s.Scan(r, got[:0])
		if err != nil {
			t.Fatal(err)
		}
		seen := make(map[int]bool)
		for _, g := range got {
			for a := range g.Pages(PageSize) {
				seen[int(uint64(a-r.Start)/PageSize)] = true
			}
		}
		if len(seen) != len(want) {
			t.Errorf("round %d: scan found %d pages, %d written", round, len(seen), len(want))
		}
		for i := range want {
			if !seen[i] {
				t.Errorf("round %d: written page %d not reported", round, i)
			}
		}
		for i := range seen {
			if !want[i] {
				t.Errorf("round %d: page %d reported but not written", round, i)
			}
		}
		if again, err := s.Scan(r, nil); err != nil || len(again) != 0 {
			t.Fatalf("round %d: second scan %v %v, want nothing", round, again, err)
		}
	}
	if _, err := u.ReadEvents(make([]Msg, 1)); err != unix.EAGAIN {
		t.Errorf("async WP queued a message: %v", err)
	}
}

// rnd is a tiny deterministic generator (splitmix64) shared by parent and
// child processes so both derive the same write sets from a seed.
type rnd struct{ s uint64 }

func newRand(seed uint64) *rnd { return &rnd{seed} }

func (r *rnd) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func (r *rnd) intn(n int) int { return int(r.next() % uint64(n)) }

func TestUnregister(t *testing.T) {
	u := openOrSkip(t, 0)
	region := mmapAnon(t, 4*ps)
	r := Range{AddrOf(region), uint64(len(region))}
	if _, err := u.Register(r, ModeMissing); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Register(Range{r.Start, PageSize}, ModeMinor); err == nil {
		t.Error("MINOR on anonymous memory accepted")
	}
	if err := u.Unregister(r); err != nil {
		t.Fatal(err)
	}
	// No longer registered: Go code may touch it, and it reads zero
	// without any message.
	if !isZero(region) {
		t.Error("unregistered anonymous memory not zero")
	}
	if _, err := u.ReadEvents(make([]Msg, 1)); err != unix.EAGAIN {
		t.Errorf("touching unregistered memory queued a message: %v", err)
	}
	if _, err := u.Copy(r.Start, make([]byte, ps), 0); !IsGone(err) {
		t.Errorf("copy into an unregistered range: %v, want ENOENT", err)
	}
}
