package traced

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// Options are Run's choices.
type Options struct {
	// Socket is the agent's socket.
	Socket string
	// LocalMem, if not 0, is the budget asked in HELLO (bytes).
	LocalMem uint64
	// MaxSlowdown, if not 0, is the slowdown target asked in HELLO
	// (millionths).
	MaxSlowdown uint32
	// Signals are forwarded to the program.
	Signals <-chan os.Signal
	Log     *zap.Logger
}

// features of the program's uffd: write-protect faults (eviction), UNMAP
// events (munmap, brk and mremap shrinking a region), REMAP (never for a
// region: see mremap), and poison for lost pages where the kernel has it.
const features = userfaultfd.FeaturePagefaultFlagWP | userfaultfd.FeatureEventUnmap | userfaultfd.FeatureEventRemap

// thread is a traced thread's state.
type thread struct {
	paged   bool      // a thread of the paged process
	fresh   bool      // not yet past the SIGSTOP a new tracee starts with
	pending uint64    // the system call whose exit stop it is waiting for, or noCall
	args    [6]uint64 // its arguments
}

const noCall = ^uint64(0)

// tracer follows one program: the process it pages (pid) and whatever it
// forks (traced, not paged).
type tracer struct {
	o        Options
	log      *zap.Logger
	pid      int
	pidfd    int
	code     uint64 // the code page's address, the same after exec
	filtered bool   // the seccomp filter is in (it stays across exec)
	features userfaultfd.Feature

	// The paged image's (set-up again at exec).
	uffd   *userfaultfd.UFFD
	cmd    []byte
	ag     *agent
	regs   regions
	brk    uint64
	paging bool

	threads map[int]*thread
}

// Result is how a traced program ended.
type Result struct {
	Code   int // its exit status, 128+N for signal N
	PID    int
	Rusage unix.Rusage // wait4's: MaxRSS is its VmHWM
}

// Run starts cmd traced and pages its memory through the agent at
// o.Socket until it exits, and says how it ended. cmd must not be started; Run sets SysProcAttr.Ptrace and
// runs on a locked OS thread (ptrace's requests must come from the thread
// that traces). If the set-up fails the program is killed.
func Run(ctx context.Context, cmd *exec.Cmd, o Options) (Result, error) {
	if runtime.GOARCH != "amd64" {
		return Result{Code: -1}, fmt.Errorf("traced: %s is not supported (amd64 only)", runtime.GOARCH)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	if err := cmd.Start(); err != nil {
		return Result{Code: -1}, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	// The tracer reaps the program itself; Wait then only finds it gone
	// (an error, ignored) and waits for exec's copying goroutines of
	// stdio that are not files.
	defer cmd.Wait()
	pid := cmd.Process.Pid
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	t := &tracer{o: o, log: log.With(zap.Int("pid", pid)), pid: pid, pidfd: -1, threads: map[int]*thread{pid: {paged: true, pending: noCall}}}
	defer func() {
		t.teardown()
		if t.pidfd >= 0 {
			unix.Close(t.pidfd)
		}
	}()
	if err := waitTrap(pid); err != nil { // the stop after execve
		return t.abort(err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return t.abort(fmt.Errorf("traced: pidfd_open: %w", err))
	}
	t.pidfd = pidfd
	avail, _, err := userfaultfd.Probe()
	if err != nil {
		return t.abort(err)
	}
	t.features = features
	if avail.Has(userfaultfd.FeaturePoison) {
		t.features |= userfaultfd.FeaturePoison
	}
	if err := t.attach(); err != nil {
		return t.abort(err)
	}
	if err := unix.PtraceSetOptions(pid, fullOptions); err != nil {
		return t.abort(fmt.Errorf("traced: PTRACE_SETOPTIONS: %w", err))
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return t.abort(fmt.Errorf("traced: resume: %w", err))
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case s := <-o.Signals:
				unix.Kill(pid, s.(syscall.Signal))
			case <-ctx.Done():
				unix.Kill(pid, unix.SIGKILL)
				return
			case <-stop:
				return
			}
		}
	}()
	res, err := t.loop()
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return res, err
}

const (
	setupOptions = unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACESYSGOOD | unix.PTRACE_O_TRACESECCOMP
	fullOptions  = setupOptions | unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEFORK |
		unix.PTRACE_O_TRACEVFORK | unix.PTRACE_O_TRACEEXEC
)

// abort kills the program after a failed set-up and reaps it.
func (t *tracer) abort(err error) (Result, error) {
	unix.Kill(t.pid, unix.SIGKILL)
	for {
		var ws unix.WaitStatus
		wpid, werr := unix.Wait4(-1, &ws, unix.WALL, nil)
		if werr == unix.EINTR {
			continue
		}
		if werr != nil || (wpid == t.pid && (ws.Exited() || ws.Signaled())) {
			return Result{Code: -1, PID: t.pid}, err
		}
	}
}

// teardown lets go of the paged image's agent connection and uffd.
func (t *tracer) teardown() {
	if t.ag != nil {
		t.ag.close()
		t.ag = nil
	}
	if t.uffd != nil {
		t.uffd.Close()
		t.uffd = nil
	}
	if t.cmd != nil {
		unix.Munmap(t.cmd)
		t.cmd = nil
	}
	t.regs, t.brk, t.paging = regions{}, 0, false
}

// attach sets the paged image up: pid is in a ptrace stop where no system
// call is in progress (after execve). See the package doc.
func (t *tracer) attach() error {
	pid := t.pid
	if err := unix.PtraceSetOptions(pid, setupOptions); err != nil {
		return fmt.Errorf("traced: PTRACE_SETOPTIONS: %w", err)
	}
	var saved unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &saved); err != nil {
		return fmt.Errorf("traced: registers: %w", err)
	}
	defer unix.PtraceSetRegs(pid, &saved)
	code, err := t.mapCode(&saved)
	if err != nil {
		return err
	}
	t.code = code
	site := code + stubSite
	call := func(nr uint64, args ...uint64) (uint64, error) {
		r, err := inject(pid, &saved, site, nr, args...)
		if err != nil {
			return 0, fmt.Errorf("traced: injected system call %d: %w", nr, err)
		}
		return r, nil
	}
	// The command page.
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
	fd, err := unix.PidfdGetfd(t.pidfd, int(mfd), 0)
	if err != nil {
		return fmt.Errorf("traced: pidfd_getfd: %w", err)
	}
	t.cmd, err = unix.Mmap(fd, 0, cmdSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
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
	ufd, err := call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	fd, err = unix.PidfdGetfd(t.pidfd, int(ufd), 0)
	if err != nil {
		return fmt.Errorf("traced: pidfd_getfd: %w", err)
	}
	if t.uffd, err = userfaultfd.Handshake(fd, t.features); err != nil {
		return err
	}
	// The parasite, made while every signal is blocked (it keeps that
	// mask: the program's signals go to its own threads).
	le := le64{t.cmd[scratchOff:]}
	le.put(0, ^uint64(0))
	mask := cmdAddr + scratchOff
	if _, err := call(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, mask, mask+8, 8); err != nil {
		return err
	}
	r := saved
	r.R12, r.R13 = cmdAddr, 0
	word(t.cmd, cmdSeq).Store(0)
	word(t.cmd, cmdAck).Store(0)
	if _, err := inject(pid, &r, code+stubCloneSite, unix.SYS_CLONE,
		unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|unix.CLONE_THREAD|unix.CLONE_SYSVSEM, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("traced: clone the parasite: %w", err)
	}
	if _, err := call(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, mask+8, 0, 8); err != nil {
		return err
	}
	// The filter, once: it stays across exec, for every thread (TSYNC).
	if !t.filtered {
		prog := cmdAddr + scratchOff + 64
		encodeFilter(t.cmd[scratchOff+64:], prog, filter(code))
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
	t.ag, err = dial(t.o.Socket, pid, os.Getpid(), t.pidfd, t.uffd, &parasite{cmd: t.cmd, pid: pid}, t.o.LocalMem, t.o.MaxSlowdown, t.log)
	if err != nil {
		return err
	}
	t.paging = true
	t.log.Debug("paging a traced program", zap.Uint64("client", t.ag.id), zap.String("code", fmt.Sprintf("%#x", code)))
	return nil
}

// mapCode maps the code page (at t.code after an exec, anywhere the first
// time) and fills it, from a syscall/int3 pair written over the
// instruction at the stop's rip for these calls.
func (t *tracer) mapCode(saved *unix.PtraceRegs) (uint64, error) {
	pid, at := t.pid, saved.Rip
	var orig [8]byte
	if _, err := unix.PtracePeekText(pid, uintptr(at), orig[:]); err != nil {
		return 0, fmt.Errorf("traced: peek at %#x: %w", at, err)
	}
	if err := poke(pid, at, stub[:3]); err != nil {
		return 0, err
	}
	flags := uint64(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS)
	if t.code != 0 {
		flags |= unix.MAP_FIXED_NOREPLACE
	}
	code, err := inject(pid, saved, at, unix.SYS_MMAP, t.code, pageSize, unix.PROT_READ|unix.PROT_WRITE, flags, ^uint64(0), 0)
	if err == nil && t.code != 0 && code != t.code {
		err = fmt.Errorf("traced: the code page went to %#x, not %#x", code, t.code)
	}
	if err == nil {
		page := make([]byte, stubName+len(stubNameBytes))
		copy(page, stub)
		copy(page[stubName:], stubNameBytes)
		if err = poke(pid, code, page); err == nil {
			_, err = inject(pid, saved, at, unix.SYS_MPROTECT, code, pageSize, unix.PROT_READ|unix.PROT_EXEC)
		}
	}
	if perr := poke(pid, at, orig[:]); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return 0, fmt.Errorf("traced: map the code page: %w", err)
	}
	return code, nil
}

// le64 writes little-endian words into a byte slice.
type le64 struct{ b []byte }

func (l le64) put(off int, v uint64) {
	for i := 0; i < 8; i++ {
		l.b[off+i] = byte(v >> (8 * i))
	}
}

// loop follows every traced thread until the paged process exits.
func (t *tracer) loop() (Result, error) {
	for {
		var ws unix.WaitStatus
		var ru unix.Rusage
		tid, err := unix.Wait4(-1, &ws, unix.WALL, &ru)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return Result{Code: -1, PID: t.pid}, fmt.Errorf("traced: wait: %w", err)
		}
		if ws.Exited() || ws.Signaled() {
			delete(t.threads, tid)
			if tid == t.pid {
				res := Result{Code: ws.ExitStatus(), PID: t.pid, Rusage: ru}
				if ws.Signaled() {
					res.Code = 128 + int(ws.Signal())
				}
				return res, nil
			}
			continue
		}
		if !ws.Stopped() {
			continue
		}
		th := t.thread(tid)
		sig := ws.StopSignal()
		switch {
		case sig == unix.SIGTRAP|0x80:
			t.syscallExit(tid, th)
		case sig == unix.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_SECCOMP:
			t.seccomp(tid, th)
		case sig == unix.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_EXEC:
			t.exec(tid, th)
		case sig == unix.SIGTRAP && ws.TrapCause() > 0:
			unix.PtraceCont(tid, 0) // clone, fork, vfork: the new tracee stops on its own
		case sig == unix.SIGSTOP && th.fresh:
			th.fresh = false
			unix.PtraceCont(tid, 0)
		case inGroupStop(tid):
			unix.PtraceCont(tid, 0) // job control does not stop a traced program (package doc)
		default:
			unix.PtraceCont(tid, int(sig)) // a signal's delivery: it goes on
		}
	}
}

// thread returns tid's state, made at its first stop: a thread of the
// paged process is paged (its system calls are followed), a forked child
// is not.
func (t *tracer) thread(tid int) *thread {
	if th := t.threads[tid]; th != nil {
		return th
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(t.pid) + "/task/" + strconv.Itoa(tid))
	th := &thread{paged: err == nil, fresh: true, pending: noCall}
	t.threads[tid] = th
	return th
}

// exec: the paged process ran execve (tid is its id now, whichever
// thread called it): its new image is set up from scratch at the call's
// exit stop (here, inside the call, the registers an injection sets would
// be overwritten with execve's result), its old one's pages are gone with
// it. A forked child's exec changes nothing.
func (t *tracer) exec(tid int, th *thread) {
	if tid != t.pid {
		unix.PtraceCont(tid, 0)
		return
	}
	for id := range t.threads {
		if id != tid {
			delete(t.threads, id)
		}
	}
	t.teardown()
	th.pending = execExit
	unix.PtraceSyscall(tid, 0)
}

// execExit marks a thread stopped at execve's exit (see exec).
const execExit = noCall - 1

// reattach sets the new image up after execve (exec).
func (t *tracer) reattach(tid int) {
	if err := t.attach(); err != nil {
		t.log.Error("the program's new image after execve is not paged", zap.Error(err))
		t.teardown()
	}
	unix.PtraceSetOptions(tid, fullOptions)
}

// seccomp handles a system call the filter stopped, at its entry.
func (t *tracer) seccomp(tid int, th *thread) {
	if !th.paged || !t.paging {
		unix.PtraceCont(tid, 0)
		return
	}
	var r unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &r); err != nil {
		unix.PtraceCont(tid, 0)
		return
	}
	a := [6]uint64{r.Rdi, r.Rsi, r.Rdx, r.R10, r.R8, r.R9}
	switch r.Orig_rax {
	case unix.SYS_MMAP:
		if a[3]&unix.MAP_FIXED == 0 && !(pageable(a) && pageUp(a[1]) >= t.ag.minAlloc) {
			break // neither a region nor over one: no exit stop
		}
		fallthrough
	case unix.SYS_BRK:
		// Followed at the exit: the address is the result.
		th.pending, th.args = r.Orig_rax, a
		unix.PtraceSyscall(tid, 0)
		return
	case unix.SYS_MREMAP:
		if t.refuseMremap(a) {
			enomem := -int64(unix.ENOMEM)
			r.Orig_rax, r.Rax = noCall, uint64(enomem)
			unix.PtraceSetRegs(tid, &r)
		}
	case unix.SYS_MADVISE:
		switch a[2] {
		case unix.MADV_DONTNEED, unix.MADV_FREE, unix.MADV_REMOVE, madvDontneedLocked:
			t.zap(a[0], a[1])
		}
	case unix.SYS_CLONE:
		if a[0]&unix.CLONE_VM == 0 {
			t.stopPaging("fork")
		}
	case unix.SYS_CLONE3:
		var flags [8]byte
		local := []unix.Iovec{{Base: &flags[0]}}
		local[0].SetLen(8)
		if n, err := unix.ProcessVMReadv(tid, local, []unix.RemoteIovec{{Base: uintptr(a[0]), Len: 8}}, 0); err == nil && n == 8 &&
			binary.LittleEndian.Uint64(flags[:])&unix.CLONE_VM == 0 {
			t.stopPaging("fork")
		}
	case unix.SYS_FORK:
		t.stopPaging("fork")
	}
	unix.PtraceCont(tid, 0)
}

const madvDontneedLocked = 24

// syscallExit finishes what seccomp began at the entry.
func (t *tracer) syscallExit(tid int, th *thread) {
	defer unix.PtraceCont(tid, 0)
	call, a := th.pending, th.args
	th.pending = noCall
	if call == execExit {
		t.reattach(tid)
		return
	}
	var r unix.PtraceRegs
	if call == noCall || !t.paging || unix.PtraceGetRegs(tid, &r) != nil {
		return
	}
	res, err := result(r.Rax)
	switch call {
	case unix.SYS_MMAP:
		if err != nil {
			return
		}
		n := pageUp(a[1])
		if a[3]&unix.MAP_FIXED != 0 {
			t.regs.forgetCovered(res, res+n) // the UNMAP event told the agent
		}
		if pageable(a) && n >= t.ag.minAlloc {
			t.register(res, n)
		}
	case unix.SYS_BRK:
		old := t.brk
		t.brk = res
		switch {
		case old == 0 || res == old:
		case res > old:
			if lo, hi := pageUp(old), pageUp(res); hi-lo >= t.ag.minAlloc {
				t.register(lo, hi-lo)
			}
		default:
			t.regs.forgetCovered(pageUp(res), pageUp(old))
		}
	}
}

// pageable reports whether mmap's arguments a make memory the agent pages:
// private, anonymous, writable, not populated at once, not hugetlb, not a
// stack that grows down.
func pageable(a [6]uint64) bool {
	prot, flags := a[2], a[3]
	return flags&unix.MAP_TYPE == unix.MAP_PRIVATE && flags&unix.MAP_ANONYMOUS != 0 && prot&unix.PROT_WRITE != 0 &&
		flags&(unix.MAP_POPULATE|unix.MAP_HUGETLB|unix.MAP_GROWSDOWN) == 0
}

func pageUp(n uint64) uint64 { return (n + pageSize - 1) &^ (pageSize - 1) }

// register makes [start, start+n) a region: the agent first, then the
// uffd (nothing can fault there before: the mapping is new, its address
// not yet returned).
func (t *tracer) register(start, n uint64) {
	reg := t.regs.next(start, start+n)
	rng := userfaultfd.Range{Start: userfaultfd.Addr(start), Len: n}
	if err := t.ag.request(&proto.RegionAdd{ID: reg.id, Range: rng, Kind: proto.KindMmap}); err != nil {
		// Over what is left of a region partly unmapped (the agent
		// keeps it whole): not paged.
		t.log.Debug("the agent refused a region", zap.Stringer("range", rng), zap.Error(err))
		return
	}
	// The agent took it: a region of the copy it overlaps was unmapped
	// whole since (UNMAP events told the agent, not the tracer).
	t.regs.forgetOverlapping(start, start+n)
	t.regs.put(reg)
	if _, err := t.uffd.Register(rng, userfaultfd.ModeMissing|userfaultfd.ModeWP); err != nil {
		t.ag.request(&proto.RegionDel{ID: reg.id, Range: rng})
		t.regs.remove(reg.id)
		t.log.Warn("registering a region failed; it is not paged", zap.Stringer("range", rng), zap.Error(err))
	}
}

// zap tells the agent that the program drops [addr, addr+n): those pages
// read as zeros from now on, never as the pool's copies. An unaligned
// address makes madvise fail: nothing is dropped.
func (t *tracer) zap(addr, n uint64) {
	if addr%pageSize != 0 {
		return
	}
	end := addr + pageUp(n)
	for _, r := range t.regs.overlapping(addr, end) {
		s, e := max(addr, r.start), min(end, r.end)
		rng := userfaultfd.Range{Start: userfaultfd.Addr(s), Len: e - s}
		if err := t.ag.request(&proto.RegionZap{ID: r.id, Range: rng}); err != nil {
			t.log.Warn("REGION_ZAP failed", zap.Stringer("range", rng), zap.Error(err))
		}
	}
}

// refuseMremap reports whether mremap's arguments a would move or grow a
// region (or a piece of one), which it refuses (package doc); shrinking in
// place goes to the kernel (the tail's UNMAP event tells the agent).
func (t *tracer) refuseMremap(a [6]uint64) bool {
	old, oldLen, newLen, flags := a[0], pageUp(a[1]), pageUp(a[2]), a[3]
	if len(t.regs.overlapping(old, old+max(oldLen, pageSize))) == 0 {
		return false
	}
	return !(oldLen > 0 && newLen <= oldLen && flags&(unix.MREMAP_FIXED|unix.MREMAP_DONTUNMAP) == 0)
}

// stopPaging brings every paged page of the process back and stops paging
// them, before a fork: the child's copy of a registered mapping is not
// registered (no FORK events), so an evicted page would read as zeros there.
func (t *tracer) stopPaging(why string) {
	if len(t.regs.list) == 0 {
		return
	}
	t.log.Warn("the traced program forks: its paged memory comes back and is no longer paged (package traced)", zap.String("call", why))
	t.ag.holdPages()
	defer t.ag.releasePages()
	buf := make([]byte, 1<<20)
	local := []unix.Iovec{{Base: &buf[0]}}
	for _, r := range t.regs.list {
		for at := r.start; at < r.end; {
			n := min(uint64(len(buf)), r.end-at)
			local[0].SetLen(int(n))
			got, _ := unix.ProcessVMReadv(t.pid, local, []unix.RemoteIovec{{Base: uintptr(at), Len: int(n)}}, 0)
			if got < int(n) {
				at += uint64(max(got, 0))&^(pageSize-1) + pageSize // a hole: unmapped since
				continue
			}
			at += n
		}
		rng := userfaultfd.Range{Start: userfaultfd.Addr(r.start), Len: r.end - r.start}
		if err := t.ag.request(&proto.RegionDel{ID: r.id, Range: rng}); err != nil {
			t.log.Warn("REGION_DEL failed", zap.Stringer("range", rng), zap.Error(err))
		}
		if err := t.uffd.Unregister(rng); err != nil {
			t.log.Debug("unregister", zap.Stringer("range", rng), zap.Error(err))
		}
	}
	t.regs.list = nil
	t.paging = false
}
