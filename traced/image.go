package traced

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// image is one paged process's address space: the program's, and each
// child it forks (until their exec, which sets up a new one).
type image struct {
	pid   int
	pidfd int
	log   *zap.Logger

	uffd    *userfaultfd.UFFD
	progUFD uint64 // the program's own descriptor of it
	cmd     []byte
	ag      *agent
	regs    regions
	brk     uint64
	paging  bool
	forks   uint64 // FORK_PREPAREs sent
	forking uint64 // the fork in flight (its serial), or 0
}

// teardown lets go of the image's agent connection, uffd and command page.
func (img *image) teardown() {
	if img.ag != nil {
		img.ag.close()
		img.ag = nil
	}
	if img.uffd != nil {
		img.uffd.Close()
		img.uffd = nil
	}
	if img.cmd != nil {
		unix.Munmap(img.cmd)
		img.cmd = nil
	}
	img.regs, img.brk, img.paging, img.forking = regions{}, 0, false, 0
}

// fork says which fork of which image a new process is: its parent, the
// FORK_PREPARE's serial.
type fork struct {
	parent *image
	serial uint64
}

// attach sets img up: img.pid is in a ptrace stop where no system call is
// in progress (after execve, or a forked child's first stop). from is
// the fork it comes from, or nil for a new image (the program, an exec):
// a forked child has its parent's code page, filter and regions (its
// copies of them: the agent made them at FORK_PREPARE). See the package
// doc.
func (t *tracer) attach(img *image, from *fork) error {
	pid := img.pid
	if err := unix.PtraceSetOptions(pid, setupOptions); err != nil {
		return fmt.Errorf("traced: PTRACE_SETOPTIONS: %w", err)
	}
	var saved unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &saved); err != nil {
		return fmt.Errorf("traced: registers: %w", err)
	}
	defer unix.PtraceSetRegs(pid, &saved)
	if from == nil {
		code, err := t.mapCode(pid, &saved)
		if err != nil {
			return err
		}
		t.code = code
	}
	code := t.code
	site := code + stubSite
	call := func(nr uint64, args ...uint64) (uint64, error) {
		r, err := inject(pid, &saved, site, nr, args...)
		if err != nil {
			return 0, fmt.Errorf("traced: injected system call %d: %w", nr, err)
		}
		return r, nil
	}
	if from != nil {
		// The parent's uffd, inherited: the child's memory is not its.
		if _, err := call(unix.SYS_CLOSE, from.parent.progUFD); err != nil {
			return err
		}
	}
	// The command page (a forked child's new one: the one it inherited is
	// its parent's).
	mfd, err := call(unix.SYS_MEMFD_CREATE, code+stubName, unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	if _, err := call(unix.SYS_FTRUNCATE, mfd, cmdSize); err != nil {
		return err
	}
	cmdAddr, err := call(unix.SYS_MMAP, 0, cmdSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED, mfd, 0)
	if err != nil {
		return err
	}
	fd, err := unix.PidfdGetfd(img.pidfd, int(mfd), 0)
	if err != nil {
		return fmt.Errorf("traced: pidfd_getfd: %w", err)
	}
	img.cmd, err = unix.Mmap(fd, 0, cmdSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("traced: map the command page: %w", err)
	}
	if _, err := call(unix.SYS_CLOSE, mfd); err != nil {
		return err
	}
	// The uffd: the program keeps its own descriptor (a uffd whose last
	// descriptor closes unregisters everything, and evicted pages would
	// read as zeros); the tracer hands a copy to the agent.
	if img.progUFD, err = call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return err
	}
	if fd, err = unix.PidfdGetfd(img.pidfd, int(img.progUFD), 0); err != nil {
		return fmt.Errorf("traced: pidfd_getfd: %w", err)
	}
	if img.uffd, err = userfaultfd.Handshake(fd, t.features); err != nil {
		return err
	}
	// The parasite, made while every signal is blocked (it keeps that
	// mask: the program's signals go to its own threads).
	binary.LittleEndian.PutUint64(img.cmd[scratchOff:], ^uint64(0))
	mask := cmdAddr + scratchOff
	if _, err := call(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, mask, mask+8, 8); err != nil {
		return err
	}
	r := saved
	r.R12, r.R13 = cmdAddr, 0
	word(img.cmd, cmdSeq).Store(0)
	word(img.cmd, cmdAck).Store(0)
	if _, err := inject(pid, &r, code+stubCloneSite, unix.SYS_CLONE,
		unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|unix.CLONE_THREAD|unix.CLONE_SYSVSEM, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("traced: clone the parasite: %w", err)
	}
	if _, err := call(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, mask+8, 0, 8); err != nil {
		return err
	}
	// The filter, once: it stays across exec and fork, for every thread
	// (TSYNC).
	if !t.filtered {
		prog := cmdAddr + scratchOff + 64
		encodeFilter(img.cmd[scratchOff+64:], prog, filter(code))
		_, err := call(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, prog)
		if errors.Is(err, unix.EACCES) {
			if _, err = call(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err == nil {
				_, err = call(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, prog)
			}
		}
		if err != nil {
			return err
		}
		t.filtered = true
	}
	hello := helloArgs{pid: pid, ppid: os.Getpid(), pidfd: img.pidfd, localMem: t.o.LocalMem, maxSlowdown: t.o.MaxSlowdown}
	if from != nil {
		// The child's copies of its parent's regions, registered with its
		// own uffd before it says HELLO: the agent gives it the copy of
		// the parent's pages FORK_PREPARE made.
		hello.ppid, hello.serial = from.parent.pid, from.serial
		img.regs = from.parent.regs.clone()
		img.brk = from.parent.brk
		if err := img.registerInherited(); err != nil {
			return err
		}
	}
	img.ag, err = dial(t.o.Socket, hello, img.uffd, &parasite{cmd: img.cmd, pid: pid}, img.log)
	if err != nil {
		return err
	}
	img.paging = true
	img.log.Debug("paging a traced process", zap.Uint64("client", img.ag.id), zap.Uint64("fork", hello.serial))
	return nil
}

// registerInherited registers, with a forked child's uffd, the pieces of
// its regions it still maps (/proc/PID/maps: a region partly unmapped
// is registered where it is mapped).
func (img *image) registerInherited() error {
	f, err := os.Open("/proc/" + strconv.Itoa(img.pid) + "/maps")
	if err != nil {
		return fmt.Errorf("traced: %w", err)
	}
	defer f.Close()
	type vma struct{ start, end uint64 }
	var vmas []vma
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		span, _, _ := strings.Cut(sc.Text(), " ")
		lo, hi, ok := strings.Cut(span, "-")
		s, err1 := strconv.ParseUint(lo, 16, 64)
		e, err2 := strconv.ParseUint(hi, 16, 64)
		if ok && err1 == nil && err2 == nil {
			vmas = append(vmas, vma{s, e})
		}
	}
	for _, r := range img.regs.list {
		for _, v := range vmas {
			s, e := max(r.start, v.start), min(r.end, v.end)
			if s >= e {
				continue
			}
			rng := userfaultfd.Range{Start: userfaultfd.Addr(s), Len: e - s}
			if _, err := img.uffd.Register(rng, userfaultfd.ModeMissing|userfaultfd.ModeWP); err != nil {
				return fmt.Errorf("traced: register the forked child's %v: %w", rng, err)
			}
		}
	}
	return nil
}

// register makes [start, start+n) a region: the agent first, then the
// uffd (nothing can fault there before: the mapping is new, its address
// not yet returned).
func (img *image) register(start, n uint64) {
	reg := img.regs.next(start, start+n)
	rng := userfaultfd.Range{Start: userfaultfd.Addr(start), Len: n}
	if err := img.ag.request(&proto.RegionAdd{ID: reg.id, Range: rng, Kind: proto.KindMmap}); err != nil {
		// Over what is left of a region partly unmapped (the agent
		// keeps it whole): not paged.
		img.log.Debug("the agent refused a region", zap.Stringer("range", rng), zap.Error(err))
		return
	}
	// The agent took it: a region of the copy it overlaps was unmapped
	// whole since (UNMAP events told the agent, not the tracer).
	img.regs.forgetOverlapping(start, start+n)
	img.regs.put(reg)
	if _, err := img.uffd.Register(rng, userfaultfd.ModeMissing|userfaultfd.ModeWP); err != nil {
		img.ag.request(&proto.RegionDel{ID: reg.id, Range: rng})
		img.regs.remove(reg.id)
		img.log.Warn("registering a region failed; it is not paged", zap.Stringer("range", rng), zap.Error(err))
	}
}

// zap tells the agent that the program drops [addr, addr+n): those pages
// read as zeros from now on, never as the pool's copies. An unaligned
// address makes madvise fail: nothing is dropped.
func (img *image) zap(addr, n uint64) {
	if addr%pageSize != 0 {
		return
	}
	end := addr + pageUp(n)
	for _, r := range img.regs.overlapping(addr, end) {
		s, e := max(addr, r.start), min(end, r.end)
		rng := userfaultfd.Range{Start: userfaultfd.Addr(s), Len: e - s}
		if err := img.ag.request(&proto.RegionZap{ID: r.id, Range: rng}); err != nil {
			img.log.Debug("REGION_ZAP failed (a region unmapped since)", zap.Stringer("range", rng), zap.Error(err))
		}
	}
}

// refuseMremap reports whether mremap's arguments a would move or grow a
// region (or a piece of one), which it refuses (package doc); shrinking in
// place goes to the kernel (the tail's UNMAP event tells the agent).
func (img *image) refuseMremap(a [6]uint64) bool {
	old, oldLen, newLen, flags := a[0], pageUp(a[1]), pageUp(a[2]), a[3]
	if len(img.regs.overlapping(old, old+max(oldLen, pageSize))) == 0 {
		return false
	}
	return !(oldLen > 0 && newLen <= oldLen && flags&(unix.MREMAP_FIXED|unix.MREMAP_DONTUNMAP) == 0)
}

// stopPaging brings every paged page of the process back and stops paging
// them, before a fork the agent could not prepare: the child's copy of a
// registered mapping is not registered, so an evicted page would read as
// zeros there.
func (img *image) stopPaging(why string) {
	if len(img.regs.list) == 0 {
		return
	}
	img.log.Warn("the traced program forks: its paged memory comes back and is no longer paged (package traced)", zap.String("why", why))
	img.ag.holdPages()
	defer img.ag.releasePages()
	buf := make([]byte, 1<<20)
	local := []unix.Iovec{{Base: &buf[0]}}
	for _, r := range img.regs.list {
		for at := r.start; at < r.end; {
			n := min(uint64(len(buf)), r.end-at)
			local[0].SetLen(int(n))
			got, _ := unix.ProcessVMReadv(img.pid, local, []unix.RemoteIovec{{Base: uintptr(at), Len: int(n)}}, 0)
			if got < int(n) {
				at += uint64(max(got, 0))&^(pageSize-1) + pageSize // a hole: unmapped since
				continue
			}
			at += n
		}
		rng := userfaultfd.Range{Start: userfaultfd.Addr(r.start), Len: r.end - r.start}
		if err := img.ag.request(&proto.RegionDel{ID: r.id, Range: rng}); err != nil {
			img.log.Debug("REGION_DEL failed", zap.Stringer("range", rng), zap.Error(err))
		}
		if err := img.uffd.Unregister(rng); err != nil {
			img.log.Debug("unregister", zap.Stringer("range", rng), zap.Error(err))
		}
	}
	img.regs.list = nil
	img.paging = false
}
