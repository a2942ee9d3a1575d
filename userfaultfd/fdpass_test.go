package userfaultfd

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range sp {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		t.Cleanup(func() { conns[i].Close() })
	}
	return conns[0], conns[1]
}

func openFDCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestSendRecvFDs(t *testing.T) {
	a, b := unixPair(t)
	mfd, err := unix.MemfdCreate("pass", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if _, err := unix.Pwrite(mfd, []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if err := SendFDs(a, []byte("payload"), mfd); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	fds := make([]int, 2)
	n, nfds, err := RecvFDs(b, buf, fds)
	if err != nil || string(buf[:n]) != "payload" || nfds != 1 {
		t.Fatalf("RecvFDs = %q, %d fds, %v", buf[:n], nfds, err)
	}
	got := make([]byte, 5)
	if _, err := unix.Pread(fds[0], got, 0); err != nil || string(got) != "hello" {
		t.Fatalf("received fd reads %q, %v", got, err)
	}
	if flags, _ := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
		t.Error("received fd is not close-on-exec")
	}
	unix.Close(fds[0])

	// Taking a descriptor back from a live process (here: ourselves).
	if os.Geteuid() == 0 {
		fd, err := TakeFD(os.Getpid(), mfd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Pread(fd, got, 0); err != nil || string(got) != "hello" {
			t.Fatalf("taken fd reads %q, %v", got, err)
		}
		unix.Close(fd)
	}
	if _, err := TakeFD(os.Getpid(), 1<<20); err == nil {
		t.Error("TakeFD of a closed fd number succeeded")
	}

	// More descriptors than expected: all received ones are closed.
	before := openFDCount(t)
	if err := SendFDs(a, nil, mfd, mfd, mfd); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RecvFDs(b, buf, fds[:1]); !errors.Is(err, ErrFDPass) {
		t.Fatalf("truncated fds: %v, want ErrFDPass", err)
	}
	if after := openFDCount(t); after != before {
		t.Errorf("open fds %d → %d: truncated descriptors leaked", before, after)
	}

	a.Close()
	if _, _, err := RecvFDs(b, buf, fds); !errors.Is(err, io.EOF) {
		t.Errorf("after close: %v, want io.EOF", err)
	}
}
