// Package fsguard holds every open and read(2) of chosen files until a
// decision allows or refuses it, with fanotify permission events
// (FAN_OPEN_PERM, FAN_ACCESS_PERM) on the files' inodes. rmem's agent uses
// it to hear of a process that opens or reads a shared memory segment it
// pages, from outside the agent (that process would read the segment's
// evicted pages as holes, zeros), and to bring the segment back into its
// file before letting it go on.
//
// It watches single files (inode marks), not directories or mounts. It
// sees opens, and reads through files opened while it watched that file
// (the kernel decides at open whether a file's reads raise permission
// events, by the marks on its inode then: measured on 6.18);
// not writes, nor mappings made through a file opened before it watched,
// inherited, or passed over a socket. It needs CAP_SYS_ADMIN. This
// process's own opens and reads are allowed without a decision (the
// decision may itself open the file).
package fsguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Key names a file: its device and inode.
type Key struct{ Dev, Ino uint64 }

// Op is what a process does to a watched file.
type Op int

const (
	Open Op = iota // open(2)
	Read           // read(2) and its kin
)

// Decide is asked for each open or read of a watched file by another
// process: pid (a thread group id) does op to the file key. It may block
// (the process waits); it returns whether the call goes on (false: it
// fails with EPERM).
type Decide func(pid int, key Key, op Op) bool

// Guard is a fanotify group whose watched files' opens wait for Decide.
type Guard struct {
	f      *os.File
	decide Decide
	self   int
	wg     sync.WaitGroup
	wmu    sync.Mutex // one response written at a time
}

// New starts a guard whose opens are decided by decide. Its goroutine runs
// until Close.
func New(decide Decide) (*Guard, error) {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_LARGEFILE)
	if err != nil {
		return nil, fmt.Errorf("fsguard: fanotify_init: %w", err)
	}
	g := &Guard{f: os.NewFile(uintptr(fd), "fanotify"), decide: decide, self: os.Getpid()}
	g.wg.Add(1)
	go g.run()
	return g, nil
}

// Watch has the opens of the file open as fd wait for a decision from now
// on.
func (g *Guard) Watch(fd int) error {
	return g.mark(unix.FAN_MARK_ADD, fd)
}

// Unwatch ends Watch (opens waiting for a decision still get theirs).
func (g *Guard) Unwatch(fd int) error {
	return g.mark(unix.FAN_MARK_REMOVE, fd)
}

func (g *Guard) mark(how uint, fd int) error {
	rc, err := g.f.SyscallConn()
	if err != nil {
		return err
	}
	var merr error
	if err := rc.Control(func(gfd uintptr) {
		merr = unix.FanotifyMark(int(gfd), how, unix.FAN_OPEN_PERM|unix.FAN_ACCESS_PERM, fd, "")
	}); err != nil {
		return err
	}
	if merr != nil {
		return fmt.Errorf("fsguard: fanotify_mark: %w", merr)
	}
	return nil
}

// Close stops the guard: opens waiting for a decision still get theirs
// (Close waits for them); those after are not held (the kernel allows the
// opens it has not had an answer for when the group goes).
func (g *Guard) Close() error {
	err := g.f.Close()
	g.wg.Wait()
	return err
}

func (g *Guard) run() {
	defer g.wg.Done()
	buf := make([]byte, 64*metaLen)
	for {
		n, err := g.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			return // the group is broken: the kernel allows what it holds
		}
		evs, perr := ParseEvents(buf[:n])
		for _, ev := range evs {
			g.handle(ev)
		}
		if perr != nil {
			continue // what parsed is answered; nothing else can be
		}
	}
}

// handle answers ev: at once for this process's own opens, otherwise
// once decide has (off the reader, which must stay free to answer this
// process's opens while a decision waits for them).
func (g *Guard) handle(ev Event) {
	if ev.Fd < 0 {
		return
	}
	op := Open
	switch {
	case ev.Mask&unix.FAN_OPEN_PERM != 0:
	case ev.Mask&unix.FAN_ACCESS_PERM != 0:
		op = Read
	default:
		unix.Close(int(ev.Fd))
		return
	}
	if ev.Pid == g.self {
		g.respond(ev.Fd, true)
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(ev.Fd), &st); err != nil {
		g.respond(ev.Fd, true) // cannot be one of ours: it has no inode to name
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.respond(ev.Fd, g.decide(ev.Pid, Key{Dev: st.Dev, Ino: st.Ino}, op))
	}()
}

// respond answers the permission event of fd and closes fd.
func (g *Guard) respond(fd int32, allow bool) {
	r := uint32(unix.FAN_ALLOW)
	if !allow {
		r = unix.FAN_DENY
	}
	var b [8]byte
	binary.NativeEndian.PutUint32(b[0:], uint32(fd))
	binary.NativeEndian.PutUint32(b[4:], r)
	g.wmu.Lock()
	g.f.Write(b[:]) // fails only once closed: the kernel has allowed it then
	g.wmu.Unlock()
	unix.Close(int(fd))
}

// Event is one fanotify event: the file, opened for us (Fd, -1 for none),
// what happened (Mask) and who did it (Pid).
type Event struct {
	Mask uint64
	Fd   int32
	Pid  int
}

const metaLen = 24 // sizeof(struct fanotify_event_metadata)

// ErrFormat: the events read from the group did not parse.
var ErrFormat = errors.New("fsguard: malformed fanotify event")

// ParseEvents decodes the events in b, a read of a fanotify group, up to
// the first that does not parse (with ErrFormat). Information records
// after an event's metadata are skipped.
func ParseEvents(b []byte) ([]Event, error) {
	var evs []Event
	for len(b) > 0 {
		if len(b) < metaLen {
			return evs, fmt.Errorf("%w: %d bytes left", ErrFormat, len(b))
		}
		evLen := binary.NativeEndian.Uint32(b[0:])
		vers, mdLen := b[4], binary.NativeEndian.Uint16(b[6:])
		switch {
		case vers != unix.FANOTIFY_METADATA_VERSION:
			return evs, fmt.Errorf("%w: version %d", ErrFormat, vers)
		case mdLen < metaLen || uint32(mdLen) > evLen || uint64(evLen) > uint64(len(b)):
			return evs, fmt.Errorf("%w: lengths %d/%d of %d", ErrFormat, mdLen, evLen, len(b))
		}
		evs = append(evs, Event{
			Mask: binary.NativeEndian.Uint64(b[8:]),
			Fd:   int32(binary.NativeEndian.Uint32(b[16:])),
			Pid:  int(int32(binary.NativeEndian.Uint32(b[20:]))),
		})
		b = b[evLen:]
	}
	return evs, nil
}
