package procinfo

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"rmem/userfaultfd"
)

// hostile are process names (comm) built to shift the fields of
// /proc/PID/stat if it were split at the first ')' or by spaces.
var hostile = []string{"a) R 1 (", "x) Z 9 8 7 (", "))", "(", "a b c", "sleep) S"}

// statLine is a /proc/PID/stat line as the kernel writes it (52 fields).
func statLine(pid int, comm string, state byte, ppid int, start uint64) string {
	return statLineFlags(pid, comm, state, ppid, start, 0)
}

// statLineFlags is statLine with the process's PF_* flags (field 9).
func statLineFlags(pid int, comm string, state byte, ppid int, start uint64, flags uint) string {
	s := strconv.Itoa(pid) + " (" + comm + ") " + string(state) + " " + strconv.Itoa(ppid)
	for i := 5; i <= 52; i++ {
		v := "0"
		switch i {
		case 9:
			v = strconv.FormatUint(uint64(flags), 10)
		case 22:
			v = strconv.FormatUint(start, 10)
		}
		s += " " + v
	}
	return s + "\n"
}

func fakeFS(t *testing.T, files map[string]string) FS {
	root := t.TempDir()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestStatHostileNames(t *testing.T) {
	for i, comm := range append(hostile, "a\n) X 3 (") {
		pid := 100 + i
		fs := fakeFS(t, map[string]string{strconv.Itoa(pid) + "/stat": statLine(pid, comm, 'S', 42, 987654)})
		s, err := fs.Stat(pid)
		if err != nil || s != (Stat{State: 'S', PPID: 42, Start: 987654}) {
			t.Errorf("comm %q: Stat = %+v, %v; want S, ppid 42, start 987654", comm, s, err)
		}
		if fs.Exited(pid) {
			t.Errorf("comm %q: a sleeping process taken for exited", comm)
		}
	}
}

func TestStatStates(t *testing.T) {
	fs := fakeFS(t, map[string]string{
		"1/stat": statLine(1, "z", 'Z', 0, 5),
		"2/stat": statLine(2, "x", 'X', 0, 5),
		"3/stat": statLine(3, "r", 'R', 0, 5),
		"4/stat": "4 (no fields)\n",
		"5/stat": "garbage",
	})
	if !fs.Exited(1) || !fs.Exited(2) || fs.Exited(3) {
		t.Error("zombie or dead not exited, or running exited")
	}
	if !fs.Exited(6) {
		t.Error("a process gone from /proc not exited")
	}
	if _, err := fs.Stat(6); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gone: %v, want ErrNotExist", err)
	}
	for _, pid := range []int{4, 5} {
		if _, err := fs.Stat(pid); !errors.Is(err, ErrParse) {
			t.Errorf("pid %d: %v, want ErrParse", pid, err)
		}
		if fs.Exited(pid) {
			t.Errorf("pid %d: an unreadable stat taken for an exit", pid)
		}
	}
}

// TestStatExiting: a process the kernel marked PF_EXITING (killed, its
// files not yet closed) is exiting but not exited; a zombie or a process
// gone is both; an unreadable stat is neither.
func TestStatExiting(t *testing.T) {
	fs := fakeFS(t, map[string]string{
		"1/stat": statLineFlags(1, "dying) S 1 (", 'R', 0, 5, 0x404044),
		"2/stat": statLineFlags(2, "r", 'S', 0, 5, 0x404040),
		"3/stat": statLine(3, "z", 'Z', 0, 5),
		"4/stat": "garbage",
	})
	if !fs.Exiting(1) || fs.Exited(1) {
		t.Error("PF_EXITING: want exiting, not exited")
	}
	if fs.Exiting(2) {
		t.Error("a live process taken for exiting")
	}
	if !fs.Exiting(3) || !fs.Exiting(9) {
		t.Error("a zombie or a process gone not exiting")
	}
	if fs.Exiting(4) {
		t.Error("an unreadable stat taken for an exit")
	}
}

// TestRealHostileName starts a real process whose name is hostile and
// reads it from the host's /proc.
func TestRealHostileName(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a) R 1 (", "x) Z 9 8 7 ("} {
		bin := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s, err := ReadStat(cmd.Process.Pid)
		self, serr := ReadStat(os.Getpid())
		if err != nil || serr != nil || s.PPID != os.Getpid() || s.Exited() || s.Start < self.Start {
			t.Errorf("%q: Stat = %+v, %v (ours %+v, %v); want our child, running, started after us", name, s, err, self, serr)
		}
		if Exiting(cmd.Process.Pid) {
			t.Errorf("%q: running, taken for exiting", name)
		}
		cmd.Process.Kill()
		for !Exiting(cmd.Process.Pid) { // the kill is not synchronous
			runtime.Gosched()
		}
		cmd.Wait()
		if !Exited(cmd.Process.Pid) {
			t.Errorf("%q: reaped, not exited", name)
		}
	}
}

func TestGroups(t *testing.T) {
	fs := fakeFS(t, map[string]string{
		"7/status":  "Name:\ta) R 1 (\\nGroups: 9\nUmask:\t0022\nState:\tS (sleeping)\nGroups:\t4 24 27 \nNgid:\t0\n",
		"8/status":  "Name:\tx\nGroups:\t\n",
		"9/status":  "Name:\tx\nUid:\t0\n",
		"10/status": "Name:\tx\nGroups:\t4 x\n",
	})
	if gs, err := fs.Groups(7); err != nil || !slices.Equal(gs, []int{4, 24, 27}) {
		t.Errorf("Groups = %v, %v; want [4 24 27] (a name with an escaped newline is not a Groups line)", gs, err)
	}
	if gs, err := fs.Groups(8); err != nil || len(gs) != 0 {
		t.Errorf("no groups: %v, %v", gs, err)
	}
	for _, pid := range []int{9, 10} {
		if _, err := fs.Groups(pid); !errors.Is(err, ErrParse) {
			t.Errorf("pid %d: %v, want ErrParse", pid, err)
		}
	}
	if gs, err := Groups(os.Getpid()); err != nil {
		t.Errorf("our own groups: %v, %v", gs, err)
	}
}

func FuzzParseGroups(f *testing.F) {
	f.Add([]byte("Name:\tx\nGroups:\t4 24 27\n"))
	f.Add([]byte("Groups:"))
	f.Add([]byte("Groups:\t-1 99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		gs, err := parseGroups(b)
		if err != nil && gs != nil {
			t.Fatalf("groups %v with error %v", gs, err)
		}
		for _, g := range gs {
			if g < 0 {
				t.Fatalf("negative group %d", g)
			}
		}
	})
}

func TestDefaultWithoutProc(t *testing.T) {
	fs, err := NewFS(filepath.Join(t.TempDir(), "none"))
	if err == nil {
		t.Fatalf("NewFS of a missing directory: %+v", fs)
	}
}

func TestTracerPid(t *testing.T) {
	fs := fakeFS(t, map[string]string{
		"7/status":  "Name:\tTracerPid: 5\nState:\tS (sleeping)\nTracerPid:\t1234\n",
		"8/status":  "Name:\tx\nTracerPid:\t0\n",
		"9/status":  "Name:\tx\n",
		"10/status": "Name:\tx\nTracerPid:\t-3\n",
	})
	if p, err := fs.TracerPid(7); err != nil || p != 1234 {
		t.Errorf("TracerPid = %d, %v; want 1234 (a name is not the TracerPid line)", p, err)
	}
	if p, err := fs.TracerPid(8); err != nil || p != 0 {
		t.Errorf("untraced: %d, %v", p, err)
	}
	for _, pid := range []int{9, 10} {
		if _, err := fs.TracerPid(pid); !errors.Is(err, ErrParse) {
			t.Errorf("pid %d: %v, want ErrParse", pid, err)
		}
	}
	if p, err := TracerPid(os.Getpid()); err != nil || p < 0 {
		t.Errorf("our own: %d, %v", p, err)
	}
}

func FuzzParseTracerPid(f *testing.F) {
	f.Add([]byte("Name:\tx\nTracerPid:\t42\n"))
	f.Add([]byte("TracerPid:"))
	f.Add([]byte("TracerPid:\t99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := parseTracerPid(b); err == nil && p < 0 {
			t.Fatalf("negative tracer %d", p)
		}
	})
}

// MappingAt finds a mapping by its start, with its file offset, and tells
// MAP_SHARED|MAP_ANONYMOUS memory from a file's.
func TestMappingAt(t *testing.T) {
	anon, err := unix.Mmap(-1, 0, 3*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	fd, err := unix.MemfdCreate("procinfo-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4*4096); err != nil {
		t.Fatal(err)
	}
	file, err := unix.Mmap(fd, 4096, 2*4096, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(file)
	start := func(b []byte) uint64 { return uint64(userfaultfd.AddrOf(b)) }
	for _, c := range []struct {
		mem  []byte
		want Mapping
	}{
		{anon, Mapping{Start: start(anon), End: start(anon) + 3*4096, Anon: true}},
		{file, Mapping{Start: start(file), End: start(file) + 2*4096, Offset: 4096}},
	} {
		got, err := MappingAt(os.Getpid(), start(c.mem))
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("MappingAt(%#x) = %+v, want %+v", start(c.mem), got, c.want)
		}
	}
	if got, err := MappingAt(os.Getpid(), start(anon)+4096); err != nil || got.Start != start(anon) {
		t.Errorf("MappingAt inside a mapping: %+v, %v, want the mapping at %#x", got, err, start(anon))
	}
	if _, err := MappingAt(os.Getpid(), 4096); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MappingAt outside any mapping: %v, want ErrNotExist", err)
	}
}

// Holders finds a process holding a file open, and one that only maps it.
func TestHolders(t *testing.T) {
	f, err := os.CreateTemp("", "holders")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	// A second file, only mapped by this process (its fd closed).
	g, err := os.CreateTemp("", "holders-mapped")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(g.Name())
	g.Truncate(4096)
	mem, err := unix.Mmap(int(g.Fd()), 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	var gst unix.Stat_t
	unix.Fstat(int(g.Fd()), &gst)
	g.Close()

	sleep := exec.Command("sleep", "30")
	sleep.ExtraFiles = []*os.File{f}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()

	hs, err := Holders(st.Dev, st.Ino)
	if err != nil {
		t.Fatal(err)
	}
	want := []Holder{{PID: os.Getpid(), Open: true}, {PID: sleep.Process.Pid, Open: true}}
	byPID := func(a, b Holder) int { return a.PID - b.PID }
	slices.SortFunc(want, byPID)
	slices.SortFunc(hs, byPID)
	if !slices.EqualFunc(hs, want, func(a, b Holder) bool { return a.PID == b.PID && a.Open == b.Open && len(a.Maps) == 0 }) {
		t.Errorf("Holders of the open file = %+v, want %+v", hs, want)
	}
	start := uint64(userfaultfd.AddrOf(mem))
	hs, err = Holders(gst.Dev, gst.Ino)
	if err != nil || len(hs) != 1 || hs[0].PID != os.Getpid() || hs[0].Open ||
		!slices.Equal(hs[0].Maps, []Mapping{{Start: start, End: start + 4096}}) {
		t.Errorf("Holders of the mapped file = %+v, %v, want this process %d mapping it at %#x", hs, err, os.Getpid(), start)
	}
}

func TestFiles(t *testing.T) {
	f, err := os.CreateTemp("", "files") // Go opens with O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	kept, err := unix.Dup(int(f.Fd())) // dup clears O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(kept)
	files, err := Files(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var got []File
	for _, fl := range files {
		if fl.Dev == st.Dev && fl.Ino == st.Ino {
			got = append(got, fl)
		}
	}
	want := []File{{FD: int(f.Fd()), Dev: st.Dev, Ino: st.Ino, CloseOnExec: true}, {FD: kept, Dev: st.Dev, Ino: st.Ino}}
	slices.SortFunc(got, func(a, b File) int { return a.FD - b.FD })
	slices.SortFunc(want, func(a, b File) int { return a.FD - b.FD })
	if !slices.Equal(got, want) {
		t.Errorf("Files: the temp file as %+v, want %+v", got, want)
	}
	if _, err := Files(1 << 30); err == nil {
		t.Error("Files of a pid that does not exist: no error")
	}
	// FilesOf: the descriptors named, those held only.
	of, err := FilesOf(os.Getpid(), []int{kept, -1, 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if want := []File{{FD: kept, Dev: st.Dev, Ino: st.Ino}}; !slices.Equal(of, want) {
		t.Errorf("FilesOf(kept, -1, a descriptor not open) = %+v, want %+v", of, want)
	}
}
