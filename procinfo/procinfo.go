// Package procinfo reads what rmem needs to know of other processes from
// /proc: a process's state, parent and start time (/proc/PID/stat, parsed
// by prometheus/procfs), its supplementary groups (/proc/PID/status), its
// mappings, its open files, and which processes hold a given file (fds
// and maps). It
// is rmem's one reader of those files: the pager (liveness probes, fork
// pairing, the restart journal's guard against pid reuse, the socket
// group's members) and the swap-mode runner use it.
//
// A process chooses its own name (comm, up to 15 bytes, any but NUL), so a
// name such as "a) R 1 (" must not shift the fields that follow it: the
// fields of stat start after the last ')'.
//
// It is not a process manager (internal/childproc) and reads nothing of
// the whole system (memory, swap: their packages read those).
package procinfo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// Stat is what rmem reads of /proc/PID/stat.
type Stat struct {
	State byte // R, S, D, T, Z (zombie), X (dead), ...
	PPID  int
	// Start is the process's start time in clock ticks since boot: with
	// the pid, it tells the process from a later one given the same pid.
	Start uint64
	// Flags are the kernel's PF_* flags of the process's main thread.
	Flags uint
}

// pfExiting is the kernel's PF_EXITING: set at the start of do_exit,
// before the process's files are closed.
const pfExiting = 0x4

// Exited reports whether the process has exited (a zombie or dead).
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// Exiting reports whether the process has exited or is exiting: a killed
// process is marked before it closes its files, so whoever sees the
// effect of its files closing (a FUSE connection aborted) sees it marked.
func (s Stat) Exiting() bool { return s.Exited() || s.Flags&pfExiting != 0 }

// FS is a /proc file system; Default is the host's.
type FS struct {
	root string
	fs   procfs.FS
}

// NewFS returns the /proc file system mounted at root (a directory).
func NewFS(root string) (FS, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return FS{}, fmt.Errorf("procinfo: %w", err)
	}
	return FS{root: root, fs: fs}, nil
}

// Default is the host's /proc; its methods fail (with os.ErrNotExist)
// when /proc is not mounted.
var Default = defaultFS()

func defaultFS() FS {
	fs, err := NewFS("/proc")
	if err != nil {
		return FS{root: "/proc"} // every read fails: nothing there
	}
	return fs
}

// ErrParse: a /proc file did not read as expected.
var ErrParse = errors.New("procinfo: unexpected format")

// Stat reads process pid's stat. An exited and reaped process's error
// wraps os.ErrNotExist (or ESRCH, when it went while being read).
func (f FS) Stat(pid int) (Stat, error) {
	p, err := f.fs.Proc(pid)
	if err != nil {
		return Stat{}, err
	}
	s, err := p.Stat()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return Stat{}, err
		}
		return Stat{}, fmt.Errorf("%w: /proc/%d/stat: %w", ErrParse, pid, err)
	}
	if len(s.State) != 1 {
		return Stat{}, fmt.Errorf("%w: /proc/%d/stat: state %q", ErrParse, pid, s.State)
	}
	return Stat{State: s.State[0], PPID: s.PPID, Start: s.Starttime, Flags: s.Flags}, nil
}

// Exited reports whether process pid has exited: gone from /proc, or a
// zombie. A stat that cannot be read for another reason is not taken for
// an exit.
func (f FS) Exited(pid int) bool {
	s, err := f.Stat(pid)
	if err != nil {
		return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)
	}
	return s.Exited()
}

// Exiting reports whether process pid has exited or is exiting (see
// Stat.Exiting); gone from /proc counts. A stat that cannot be read for
// another reason is not taken for an exit.
func (f FS) Exiting(pid int) bool {
	s, err := f.Stat(pid)
	if err != nil {
		return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)
	}
	return s.Exiting()
}

// Groups reads the supplementary groups of process pid (the Groups line
// of /proc/PID/status).
func (f FS) Groups(pid int) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(f.root, strconv.Itoa(pid), "status"))
	if err != nil {
		return nil, err
	}
	return parseGroups(b)
}

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Offset     uint64 // in the file mapped
	// Anon: MAP_SHARED|MAP_ANONYMOUS memory (the kernel's "/dev/zero
	// (deleted)" file), reachable only through its mappings.
	Anon bool
}

// MappingAt returns process pid's mapping that holds address a (from
// /proc/PID/maps, parsed by prometheus/procfs).
func (f FS) MappingAt(pid int, a uint64) (Mapping, error) {
	p, err := f.fs.Proc(pid)
	if err != nil {
		return Mapping{}, fmt.Errorf("procinfo: %w", err)
	}
	maps, err := p.ProcMaps()
	if err != nil {
		return Mapping{}, fmt.Errorf("procinfo: maps of %d: %w", pid, err)
	}
	for _, m := range maps {
		if uint64(m.StartAddr) <= a && a < uint64(m.EndAddr) {
			return Mapping{Start: uint64(m.StartAddr), End: uint64(m.EndAddr), Offset: uint64(m.Offset),
				Anon: m.Pathname == "/dev/zero (deleted)"}, nil
		}
	}
	return Mapping{}, fmt.Errorf("procinfo: no mapping of %d holds %#x: %w", pid, a, os.ErrNotExist)
}

// Holder is a process that holds a file: its mappings of it, and whether
// it has it open.
type Holder struct {
	PID  int
	Maps []Mapping
	Open bool
}

// Holders returns the processes that have the file dev/ino open or mapped
// (/proc/PID/fd and /proc/PID/maps of every process; one that goes while
// being read is not counted). Reading another user's fds needs root.
func (f FS) Holders(dev, ino uint64) ([]Holder, error) {
	procs, err := f.fs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("procinfo: %w", err)
	}
	var hs []Holder
	for _, p := range procs {
		if h := f.holder(p, dev, ino); h.Open || len(h.Maps) > 0 {
			hs = append(hs, h)
		}
	}
	return hs, nil
}

func (f FS) holder(p procfs.Proc, dev, ino uint64) Holder {
	h := Holder{PID: p.PID}
	if maps, err := p.ProcMaps(); err == nil {
		for _, m := range maps {
			if m.Dev == dev && m.Inode == ino {
				h.Maps = append(h.Maps, Mapping{Start: uint64(m.StartAddr), End: uint64(m.EndAddr), Offset: uint64(m.Offset),
					Anon: m.Pathname == "/dev/zero (deleted)"})
			}
		}
	}
	fds, err := p.FileDescriptors()
	if err != nil {
		return h
	}
	dir := filepath.Join(f.root, strconv.Itoa(p.PID), "fd")
	for _, fd := range fds {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, strconv.FormatUint(uint64(fd), 10)), &st) == nil && st.Dev == dev && st.Ino == ino {
			h.Open = true
			break
		}
	}
	return h
}

// File is a descriptor a process holds: the file's device and inode, and
// whether the descriptor closes on exec (O_CLOEXEC).
type File struct {
	FD          int
	Dev, Ino    uint64
	CloseOnExec bool
}

// Files returns process pid's open descriptors (one closed while being
// read is left out). Reading another user's needs root.
func (f FS) Files(pid int) ([]File, error) {
	p, err := f.fs.Proc(pid)
	if err != nil {
		return nil, fmt.Errorf("procinfo: %w", err)
	}
	fds, err := p.FileDescriptors()
	if err != nil {
		return nil, fmt.Errorf("procinfo: %w", err)
	}
	return f.files(p, fds)
}

// FilesOf is Files for the descriptors fds of process pid only: those it
// holds, without reading the others.
func (f FS) FilesOf(pid int, fds []int) ([]File, error) {
	p, err := f.fs.Proc(pid)
	if err != nil {
		return nil, fmt.Errorf("procinfo: %w", err)
	}
	u := make([]uintptr, 0, len(fds))
	for _, fd := range fds {
		if fd >= 0 {
			u = append(u, uintptr(fd))
		}
	}
	return f.files(p, u)
}

func (f FS) files(p procfs.Proc, fds []uintptr) ([]File, error) {
	dir := filepath.Join(f.root, strconv.Itoa(p.PID), "fd")
	files := make([]File, 0, len(fds))
	for _, fd := range fds {
		name := strconv.FormatUint(uint64(fd), 10)
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, name), &st) != nil {
			continue
		}
		info, err := p.FDInfo(name)
		if err != nil {
			continue
		}
		flags, err := strconv.ParseUint(info.Flags, 8, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: /proc/%d/fdinfo/%s flags %q", ErrParse, p.PID, name, info.Flags)
		}
		files = append(files, File{FD: int(fd), Dev: st.Dev, Ino: st.Ino, CloseOnExec: flags&unix.O_CLOEXEC != 0})
	}
	return files, nil
}

// TracerPid reads the pid of the process tracing process pid (the
// TracerPid line of /proc/PID/status): 0 when none traces it.
func (f FS) TracerPid(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(f.root, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	return parseTracerPid(b)
}

func parseTracerPid(b []byte) (int, error) {
	rest, err := statusLine(b, "TracerPid:")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(rest)))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: status: TracerPid %q", ErrParse, rest)
	}
	return n, nil
}

// statusLine returns what follows key on its line of a status file. The
// process's name (the Name line, first) may hold anything but NUL and
// newline (the kernel escapes newlines there), so lines are matched whole.
func statusLine(b []byte, key string) ([]byte, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte(key)); ok {
			return rest, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: status: %w", ErrParse, err)
	}
	return nil, fmt.Errorf("%w: status has no %s line", ErrParse, strings.TrimSuffix(key, ":"))
}

// parseGroups finds the Groups line of a status file.
func parseGroups(b []byte) ([]int, error) {
	rest, err := statusLine(b, "Groups:")
	if err != nil {
		return nil, err
	}
	var gs []int
	for _, f := range bytes.Fields(rest) {
		g, err := strconv.Atoi(string(f))
		if err != nil || g < 0 {
			return nil, fmt.Errorf("%w: status: group %q", ErrParse, f)
		}
		gs = append(gs, g)
	}
	return gs, nil
}

// TracerPid is Default.TracerPid.
func TracerPid(pid int) (int, error) { return Default.TracerPid(pid) }

// Files is Default.Files.
func Files(pid int) ([]File, error) { return Default.Files(pid) }

// FilesOf is Default.FilesOf.
func FilesOf(pid int, fds []int) ([]File, error) { return Default.FilesOf(pid, fds) }

// MappingAt reads the host's /proc (FS.MappingAt).
func MappingAt(pid int, a uint64) (Mapping, error) { return Default.MappingAt(pid, a) }

// ReadStat is Default.Stat.
func ReadStat(pid int) (Stat, error) { return Default.Stat(pid) }

// Exited is Default.Exited.
func Exited(pid int) bool { return Default.Exited(pid) }

// Exiting is Default.Exiting.
func Exiting(pid int) bool { return Default.Exiting(pid) }

// Groups is Default.Groups.
func Groups(pid int) ([]int, error) { return Default.Groups(pid) }

// Holders is Default.Holders.
func Holders(dev, ino uint64) ([]Holder, error) { return Default.Holders(dev, ino) }
