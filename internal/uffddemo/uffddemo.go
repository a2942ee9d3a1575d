package uffddemo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

const (
	childEnv     = "RMEM_UFFDDEMO_CHILD"
	childSizeEnv = "RMEM_UFFDDEMO_SIZE"
	childArg     = "__uffddemo_child" // shows in ps; ignored otherwise
	childSockFD  = 3

	// DefaultSize is the memory the child allocates when Options.Size is 0.
	DefaultSize = 256 << 20
)

// Options configure Run.
type Options struct {
	// Size is the bytes the child allocates and verifies (rounded up to
	// whole pages); 0 means DefaultSize.
	Size int64
	// Batch is the pages copied per fault (1 to 64); 0 means 1. With
	// Batch > 1 the child only times the first touch of each batch.
	Batch int

	corruptPage int // tests: serve page corruptPage-1 with a wrong pattern
}

func (o *Options) validate() error {
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Batch == 0 {
		o.Batch = 1
	}
	if o.Size < 0 || o.Size > 1<<40 {
		return fmt.Errorf("uffddemo: Size %d out of range (1 B to 1 TiB)", o.Size)
	}
	if o.Batch < 1 || o.Batch > 64 {
		return fmt.Errorf("uffddemo: Batch %d out of range (1 to 64)", o.Batch)
	}
	return nil
}

// Result is what Run measured.
type Result struct {
	Pages      int           // pages the child touched and verified
	Faults     int           // faults the parent served
	Repeats    int           // faults reported again after being served (not in Faults)
	Mismatches int           // pages that read back wrong (0 on success)
	P50, P99   time.Duration // fault-to-resume latency seen by the child
	Elapsed    time.Duration // the child's time to touch everything
}

// ErrMismatch: the child read back pages that differ from the pattern.
var ErrMismatch = errors.New("uffddemo: pages read back wrong")

// IsChild reports whether this process is a demo child.
func IsChild() bool { return os.Getenv(childEnv) == "1" }

// MaybeRunChild runs ChildMain and exits if this process is a demo child;
// otherwise it returns at once. Call it first thing in main.
func MaybeRunChild() {
	if !IsChild() {
		return
	}
	if err := ChildMain(); err != nil {
		fmt.Fprintln(os.Stderr, "uffd-demo child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// pattern is the content of word w of page p.
func pattern(p, w uint64) uint64 {
	x := p<<20 ^ w ^ 0x5851f42d4c957f2d
	x ^= x >> 31
	return x * 0x9e3779b97f4a7c15
}

func fill(buf []byte, firstPage uint64) {
	ps := int(userfaultfd.PageSize)
	for off := 0; off+8 <= len(buf); off += 8 {
		binary.LittleEndian.PutUint64(buf[off:], pattern(firstPage+uint64(off/ps), uint64(off%ps/8)))
	}
}

// ChildMain is the child side: map, register, hand the uffd to the parent
// on fd 3, touch and verify every page, report.
func ChildMain() error {
	size, err := strconv.ParseInt(os.Getenv(childSizeEnv), 10, 64)
	if err != nil || size <= 0 {
		return fmt.Errorf("bad %s=%q", childSizeEnv, os.Getenv(childSizeEnv))
	}
	f := os.NewFile(childSockFD, "uffddemo-sock")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("socket on fd %d: %w", childSockFD, err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()
	region, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	u, err := userfaultfd.Open(0)
	if err != nil {
		return err
	}
	r := userfaultfd.Range{Start: userfaultfd.AddrOf(region), Len: uint64(size)}
	if _, err := u.Register(r, userfaultfd.ModeMissing); err != nil {
		return err
	}
	var hello [24]byte
	binary.LittleEndian.PutUint64(hello[0:], uint64(r.Start))
	binary.LittleEndian.PutUint64(hello[8:], r.Len)
	binary.LittleEndian.PutUint64(hello[16:], uint64(u.Features()))
	if err := userfaultfd.SendFDs(conn, hello[:], u.Fd()); err != nil {
		return err
	}
	// Keep our own reference to the uffd: if the parent dies, faults block
	// instead of resuming with zero pages.
	var hdr [16]byte // go: batch (8), reserved (8)
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return fmt.Errorf("waiting for the parent: %w", err)
	}
	batch := int(binary.LittleEndian.Uint64(hdr[:]))
	ps := int(userfaultfd.PageSize)
	pages := int(size) / ps
	lat := make([]int64, 0, pages/batch+1)
	mismatches := uint64(0)
	start := time.Now()
	for p := range pages {
		page := region[p*ps : (p+1)*ps]
		t0 := time.Now()
		first := binary.LittleEndian.Uint64(page) // the first touch faults
		if p%batch == 0 {
			lat = append(lat, int64(time.Since(t0)))
		}
		ok := first == pattern(uint64(p), 0)
		for w := 8; ok && w < ps; w += 8 {
			ok = binary.LittleEndian.Uint64(page[w:]) == pattern(uint64(p), uint64(w/8))
		}
		if !ok {
			mismatches++
		}
	}
	elapsed := time.Since(start)
	out := []uint64{uint64(pages), mismatches, uint64(elapsed), uint64(len(lat))}
	if err := binary.Write(conn, binary.LittleEndian, out); err != nil {
		return err
	}
	if err := binary.Write(conn, binary.LittleEndian, lat); err != nil {
		return err
	}
	runtime.KeepAlive(u) // the fd stays open until exit, see above
	return nil
}

// Run starts the child (this executable, re-executed), serves its faults
// and prints a summary to w. It returns ErrMismatch if any page read back
// wrong, and stops the child if ctx ends.
func Run(ctx context.Context, w io.Writer, opts Options) (Result, error) {
	if err := opts.validate(); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	ps := int64(userfaultfd.PageSize)
	size := (opts.Size + ps - 1) / ps * ps
	exe, err := os.Executable()
	if err != nil {
		return Result{}, fmt.Errorf("uffddemo: own executable: %w", err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return Result{}, fmt.Errorf("uffddemo: socketpair: %w", err)
	}
	pf, cf := os.NewFile(uintptr(sp[0]), "uffddemo-parent"), os.NewFile(uintptr(sp[1]), "uffddemo-child")
	fc, err := net.FileConn(pf)
	pf.Close()
	if err != nil {
		cf.Close()
		return Result{}, fmt.Errorf("uffddemo: %w", err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()

	cmd := exec.Command(exe, childArg)
	cmd.Env = append(os.Environ(), childEnv+"=1", childSizeEnv+"="+strconv.FormatInt(size, 10))
	cmd.ExtraFiles = []*os.File{cf} // fd 3
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		cf.Close()
		return Result{}, fmt.Errorf("uffddemo: start child: %w", err)
	}
	cf.Close()
	waited := false
	defer func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	// A cancelled context unblocks the socket reads below.
	stopWatch := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stopWatch()

	hello := make([]byte, 24)
	fds := make([]int, 1)
	if n, nfds, err := userfaultfd.RecvFDs(conn, hello, fds); err != nil || n != len(hello) || nfds != 1 {
		return Result{}, childErr(ctx, "receiving the child's uffd", err)
	}
	base := userfaultfd.Addr(binary.LittleEndian.Uint64(hello))
	length := binary.LittleEndian.Uint64(hello[8:])
	u, err := userfaultfd.FromFD(fds[0], userfaultfd.Feature(binary.LittleEndian.Uint64(hello[16:])))
	if err != nil {
		unix.Close(fds[0])
		return Result{}, err
	}
	defer u.Close()
	p, err := userfaultfd.NewPoller(u)
	if err != nil {
		return Result{}, err
	}
	defer p.Close()

	var faults, repeats int
	serveErr := make(chan error, 1)
	go func() { serveErr <- serve(p, u, base, length, opts, &faults, &repeats) }()

	var start [16]byte
	binary.LittleEndian.PutUint64(start[:], uint64(opts.Batch))
	if _, err := conn.Write(start[:]); err != nil {
		p.Stop()
		<-serveErr
		return Result{}, childErr(ctx, "starting the child", err)
	}
	var hdr [4]uint64
	rerr := binary.Read(conn, binary.LittleEndian, &hdr)
	var lat []int64
	if rerr == nil && hdr[3] <= hdr[0] {
		lat = make([]int64, hdr[3])
		rerr = binary.Read(conn, binary.LittleEndian, lat)
	}
	p.Stop()
	if err := <-serveErr; err != nil && !errors.Is(err, userfaultfd.ErrStopped) {
		return Result{}, fmt.Errorf("uffddemo: serving faults: %w", err)
	}
	if rerr != nil {
		return Result{}, childErr(ctx, "reading the child's report", rerr)
	}
	waited = true
	if err := cmd.Wait(); err != nil {
		return Result{}, fmt.Errorf("uffddemo: child: %w", err)
	}
	res := Result{
		Pages:      int(hdr[0]),
		Faults:     faults,
		Repeats:    repeats,
		Mismatches: int(hdr[1]),
		Elapsed:    time.Duration(hdr[2]),
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50 = time.Duration(lat[len(lat)/2])
		res.P99 = time.Duration(lat[min(len(lat)-1, len(lat)*99/100)])
	}
	fmt.Fprintf(w, "uffd-demo: child %d touched %d pages (%d MiB) in %v, %d read back wrong\n",
		cmd.Process.Pid, res.Pages, size>>20, res.Elapsed.Round(time.Millisecond), res.Mismatches)
	fmt.Fprintf(w, "uffd-demo: %d faults served with UFFDIO_COPY (%d page(s) each), %.0f faults/s, %d reported again\n",
		res.Faults, opts.Batch, float64(res.Faults)/res.Elapsed.Seconds(), res.Repeats)
	fmt.Fprintf(w, "uffd-demo: fault-to-resume latency p50 %v, p99 %v\n", res.P50, res.P99)
	if res.Mismatches != 0 {
		return res, fmt.Errorf("%w: %d of %d", ErrMismatch, res.Mismatches, res.Pages)
	}
	return res, nil
}

func childErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("uffddemo: %s: %w", what, ctx.Err())
	}
	return fmt.Errorf("uffddemo: %s: %w", what, err)
}

// serve resolves every fault of [base, base+length) with a Copy of the
// generated pattern, opts.Batch pages at a time, on a locked OS thread.
// The buffer is allocated once.
func serve(p *userfaultfd.Poller, u *userfaultfd.UFFD, base userfaultfd.Addr, length uint64, opts Options, faults, repeats *int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ps := userfaultfd.PageSize
	block := uint64(opts.Batch) * ps
	buf := make([]byte, block)
	msgs := make([]userfaultfd.Msg, 32)
	for {
		n, err := p.Wait(msgs)
		if err != nil {
			return err
		}
		for i := range msgs[:n] {
			ev, err := msgs[i].Decode()
			if err != nil {
				return err
			}
			if ev.Kind != userfaultfd.EventPagefault {
				continue
			}
			off := uint64(ev.Addr-base) / block * block
			if off >= length {
				return fmt.Errorf("fault at %v outside the region", ev.Addr)
			}
			n := min(block, length-off)
			fill(buf[:n], off/ps)
			if c := opts.corruptPage - 1; c >= 0 && uint64(c)*ps >= off && uint64(c)*ps < off+n {
				buf[uint64(c)*ps-off+100] ^= 1
			}
			_, err = u.Copy(base+userfaultfd.Addr(off), buf[:n], 0)
			if userfaultfd.IsExist(err) {
				// Reported again (a signal interrupted the child's fault
				// before it was served): the page is there, just wake.
				*repeats++
				if err := u.Wake(userfaultfd.Range{Start: ev.Addr.RoundDown(ps), Len: ps}); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			*faults++
		}
	}
}
