package traced

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/procinfo"
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
	img     *image    // the paged process it belongs to, or nil
	fresh   bool      // not yet past the SIGSTOP a new tracee starts with
	pending uint64    // the system call whose exit stop it is waiting for, or noCall
	args    [6]uint64 // its arguments
	serial  uint64    // the fork it is making (FORK_PREPARE's serial)
}

const noCall = ^uint64(0)

// tracer follows one program: the processes it pages (the program, the
// children it forks, each an image) and whatever else they start (traced,
// not paged).
type tracer struct {
	o        Options
	log      *zap.Logger
	pid      int    // the program's
	code     uint64 // the code page's address, the same after exec and in children
	filtered bool   // the seccomp filter is in (it stays across exec and fork)
	features userfaultfd.Feature

	images  map[int]*image // by pid
	threads map[int]*thread
	forkOf  map[int]fork // a child's pid (EVENT_FORK) -> the fork it comes from
	held    map[int]bool // a child stopped before its parent's EVENT_FORK named it
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
	t := &tracer{o: o, log: log, pid: pid, images: map[int]*image{}, threads: map[int]*thread{},
		forkOf: map[int]fork{}, held: map[int]bool{}}
	defer t.closeAll()
	if err := waitTrap(pid); err != nil { // the stop after execve
		return t.abort(err)
	}
	avail, _, err := userfaultfd.Probe()
	if err != nil {
		return t.abort(err)
	}
	t.features = features
	if avail.Has(userfaultfd.FeaturePoison) {
		t.features |= userfaultfd.FeaturePoison
	}
	img, err := t.newImage(pid)
	if err != nil {
		return t.abort(err)
	}
	t.threads[pid] = &thread{img: img, pending: noCall}
	if err := t.attach(img, nil); err != nil {
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

// newImage starts the image of process pid (not yet attached).
func (t *tracer) newImage(pid int) (*image, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("traced: pidfd_open: %w", err)
	}
	img := &image{pid: pid, pidfd: pidfd, log: t.log.With(zap.Int("pid", pid))}
	t.images[pid] = img
	return img, nil
}

// dropImage lets go of img: its process exited.
func (t *tracer) dropImage(img *image) {
	img.teardown()
	unix.Close(img.pidfd)
	delete(t.images, img.pid)
}

func (t *tracer) closeAll() {
	for _, img := range t.images {
		t.dropImage(img)
	}
}

// mapCode maps the code page (at t.code after an exec, anywhere the first
// time) and fills it, from a syscall/int3 pair written over the
// instruction at the stop's rip for these calls.
func (t *tracer) mapCode(pid int, saved *unix.PtraceRegs) (uint64, error) {
	at := saved.Rip
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
			delete(t.held, tid)
			if img := t.images[tid]; img != nil {
				t.dropImage(img)
			}
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
		case sig == unix.SIGTRAP && (ws.TrapCause() == unix.PTRACE_EVENT_FORK || ws.TrapCause() == unix.PTRACE_EVENT_CLONE):
			t.forked(tid, th)
		case sig == unix.SIGTRAP && ws.TrapCause() > 0:
			unix.PtraceCont(tid, 0) // vfork and its end: the new tracee stops on its own
		case sig == unix.SIGSTOP && th.fresh:
			t.started(tid, th)
		case inGroupStop(tid):
			unix.PtraceCont(tid, 0) // job control does not stop a traced program (package doc)
		default:
			unix.PtraceCont(tid, int(sig)) // a signal's delivery: it goes on
		}
	}
}

// thread returns tid's state, made at its first stop: a thread of a paged
// process is paged (its system calls are followed); anything else is
// not, unless it is a forked child started (started).
func (t *tracer) thread(tid int) *thread {
	if th := t.threads[tid]; th != nil {
		return th
	}
	th := &thread{fresh: true, pending: noCall}
	if img := t.images[tid]; img != nil {
		th.img = img
	} else {
		for _, img := range t.images {
			if _, err := os.Stat("/proc/" + strconv.Itoa(img.pid) + "/task/" + strconv.Itoa(tid)); err == nil {
				th.img = img
				break
			}
		}
	}
	t.threads[tid] = th
	return th
}

// started handles a new tracee's first stop. A child forked by a paged
// process, with regions (a FORK_PREPARE), is paged on its own: it is set
// up before it runs (an evicted page of its copy would read as zeros),
// once its parent's EVENT_FORK has said which fork it is (held until
// then). Anything else runs on.
func (t *tracer) started(tid int, th *thread) {
	th.fresh = false
	if th.img != nil {
		unix.PtraceCont(tid, 0)
		return
	}
	if f, ok := t.forkOf[tid]; ok {
		delete(t.forkOf, tid)
		t.startChild(tid, th, f)
		return
	}
	if t.forkingParent(tid) {
		t.held[tid] = true
		return
	}
	unix.PtraceCont(tid, 0)
}

// forkingParent reports whether process tid's parent is a paged process
// with a fork in flight.
func (t *tracer) forkingParent(tid int) bool {
	st, err := procinfo.ReadStat(tid)
	if err != nil {
		return false
	}
	p := t.images[st.PPID]
	return p != nil && p.forking != 0
}

// forked: thread tid of a paged process made a new tracee (EVENT_FORK, or
// EVENT_CLONE of a clone without CLONE_VM).
func (t *tracer) forked(tid int, th *thread) {
	defer unix.PtraceCont(tid, 0)
	msg, err := unix.PtraceGetEventMsg(tid)
	if err != nil || th.img == nil || th.serial == 0 {
		return
	}
	child := int(msg)
	f := fork{parent: th.img, serial: th.serial}
	if t.held[child] {
		delete(t.held, child)
		ct := t.thread(child)
		t.startChild(child, ct, f)
		return
	}
	t.forkOf[child] = f
}

// startChild sets up the image of a child forked from f, stopped at its
// first stop, and lets it run.
func (t *tracer) startChild(pid int, th *thread, f fork) {
	defer unix.PtraceCont(pid, 0)
	img, err := t.newImage(pid)
	if err == nil {
		th.img = img
		if err = t.attach(img, &f); err != nil {
			img.teardown()
		}
	}
	if err != nil {
		t.log.Error("a forked child is not paged; its copy of its parent's evicted pages is lost to it", zap.Int("child", pid), zap.Error(err))
		// Nothing of the parent's evicted pages can reach it: it must
		// not read them as zeros.
		unix.Kill(pid, unix.SIGKILL)
		return
	}
	unix.PtraceSetOptions(pid, fullOptions)
}

// exec: a paged process ran execve (tid is its id now, whichever thread
// called it): its new image is set up from scratch at the call's exit
// stop (here, inside the call, the registers an injection sets would be
// overwritten with execve's result), its old one's pages are gone with
// it. Another tracee's exec changes nothing.
func (t *tracer) exec(tid int, th *thread) {
	img := t.images[tid]
	if img == nil {
		unix.PtraceCont(tid, 0)
		return
	}
	for id, o := range t.threads {
		if id != tid && o.img == img {
			delete(t.threads, id)
		}
	}
	th.img = img
	img.teardown()
	th.pending = execExit
	unix.PtraceSyscall(tid, 0)
}

// execExit marks a thread stopped at execve's exit (see exec).
const execExit = noCall - 1

// forkExit marks a thread stopped at a prepared fork's exit (seccomp).
const forkExit = noCall - 2

// reattach sets the new image up after execve (exec).
func (t *tracer) reattach(tid int, img *image) {
	if err := t.attach(img, nil); err != nil {
		img.log.Error("the new image after execve is not paged", zap.Error(err))
		img.teardown()
	}
	unix.PtraceSetOptions(tid, fullOptions)
}

// seccomp handles a system call the filter stopped, at its entry.
func (t *tracer) seccomp(tid int, th *thread) {
	img := th.img
	if img == nil || !img.paging {
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
		if a[3]&unix.MAP_FIXED == 0 && !(pageable(a) && pageUp(a[1]) >= img.ag.minAlloc) {
			break // neither a region nor over one: no exit stop
		}
		fallthrough
	case unix.SYS_BRK:
		// Followed at the exit: the address is the result.
		th.pending, th.args = r.Orig_rax, a
		unix.PtraceSyscall(tid, 0)
		return
	case unix.SYS_MREMAP:
		if img.refuseMremap(a) {
			enomem := -int64(unix.ENOMEM)
			r.Orig_rax, r.Rax = noCall, uint64(enomem)
			unix.PtraceSetRegs(tid, &r)
		}
	case unix.SYS_MADVISE:
		switch a[2] {
		case unix.MADV_DONTNEED, unix.MADV_FREE, unix.MADV_REMOVE, madvDontneedLocked:
			img.zap(a[0], a[1])
		}
	case unix.SYS_CLONE, unix.SYS_CLONE3, unix.SYS_FORK:
		if t.forks(tid, r.Orig_rax, a[0]) && t.prepareFork(img, th) {
			unix.PtraceSyscall(tid, 0)
			return
		}
	}
	unix.PtraceCont(tid, 0)
}

// forks reports whether clone, clone3 (flags read from its struct at arg)
// or fork makes a process of its own (no CLONE_VM: not a thread, not
// vfork).
func (t *tracer) forks(tid int, nr, arg uint64) bool {
	switch nr {
	case unix.SYS_FORK:
		return true
	case unix.SYS_CLONE:
		return arg&unix.CLONE_VM == 0
	}
	var flags [8]byte
	local := []unix.Iovec{{Base: &flags[0]}}
	local[0].SetLen(8)
	n, err := unix.ProcessVMReadv(tid, local, []unix.RemoteIovec{{Base: uintptr(arg), Len: 8}}, 0)
	return err == nil && n == 8 && binary.LittleEndian.Uint64(flags[:])&unix.CLONE_VM == 0
}

// prepareFork has the agent copy img's pooled pages for the child about
// to be forked by thread th (FORK_PREPARE), and reports whether it did:
// the child is then paged on its own (startChild), and the fork's exit
// says FORK_DONE. One fork of a process at a time; without the agent's
// copy, the process stops being paged instead (stopPaging).
func (t *tracer) prepareFork(img *image, th *thread) bool {
	if len(img.regs.list) == 0 {
		return false
	}
	if img.forking != 0 {
		img.stopPaging("two forks at once")
		return false
	}
	img.forks++
	if err := img.ag.request(&proto.ForkPrepare{Serial: img.forks}); err != nil {
		img.stopPaging("FORK_PREPARE: " + err.Error())
		return false
	}
	img.forking = img.forks
	th.pending, th.serial = forkExit, img.forks
	return true
}

const madvDontneedLocked = 24

// syscallExit finishes what seccomp (or exec) began at the entry.
func (t *tracer) syscallExit(tid int, th *thread) {
	defer unix.PtraceCont(tid, 0)
	call, a, serial := th.pending, th.args, th.serial
	th.pending, th.serial = noCall, 0
	img := th.img
	if call == execExit && img != nil {
		t.reattach(tid, img)
		return
	}
	var r unix.PtraceRegs
	if call == noCall || img == nil || unix.PtraceGetRegs(tid, &r) != nil {
		return
	}
	res, err := result(r.Rax)
	if call == forkExit {
		// What fork returned, for the agent's copy: the child's pid, or
		// the error (the copy is freed).
		pid := int32(res)
		if err != nil {
			pid = -int32(err.(unix.Errno))
		}
		img.forking = 0
		if img.ag != nil {
			img.ag.send(0, &proto.ForkDone{Serial: serial, PID: pid})
		}
		return
	}
	if !img.paging {
		return
	}
	switch call {
	case unix.SYS_MMAP:
		if err != nil {
			return
		}
		n := pageUp(a[1])
		if a[3]&unix.MAP_FIXED != 0 {
			img.regs.forgetCovered(res, res+n) // the UNMAP event told the agent
		}
		if pageable(a) && n >= img.ag.minAlloc {
			img.register(res, n)
		}
	case unix.SYS_BRK:
		old := img.brk
		img.brk = res
		switch {
		case old == 0 || res == old:
		case res > old:
			if lo, hi := pageUp(old), pageUp(res); hi-lo >= img.ag.minAlloc {
				img.register(lo, hi-lo)
			}
		default:
			img.regs.forgetCovered(pageUp(res), pageUp(old))
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
