package pager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"rmem/pager"
	"rmem/pager/pagertest"
	"rmem/pager/proto"
)

func TestOptionsValidate(t *testing.T) {
	store := pagertest.New(t, pagertest.Options{})
	good := pager.Options{Store: store, LocalMem: 1 << 20}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		mod   func(*pager.Options)
	}{
		{"Store", func(o *pager.Options) { o.Store = nil }},
		{"LocalMem", func(o *pager.Options) { o.LocalMem = 4096 }},
		{"NodeMem", func(o *pager.Options) { o.NodeMem = 1 }},
		{"StagingSlots", func(o *pager.Options) { o.StagingSlots = 3 }},
		{"HandshakeTimeout", func(o *pager.Options) { o.HandshakeTimeout = -1 }},
		{"SocketMode", func(o *pager.Options) { o.SocketMode = os.ModeDir | 0o600 }},
	} {
		o := good
		tc.mod(&o)
		err := o.Validate()
		if !errors.Is(err, pager.ErrOptions) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v", tc.field, err)
		}
	}
}

// The agent refuses a HELLO whose pid is not the peer's, a forked child
// nobody forked, and garbage, answering ERROR and closing only that
// connection; the socket has mode 0660.
func TestHandshakeRefusals(t *testing.T) {
	store := pagertest.New(t, pagertest.Options{})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	a, err := pager.New(pager.Options{Socket: sock, Store: store, LocalMem: 1 << 20, HandshakeTimeout: 200e6})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	defer func() {
		a.Close()
		<-done
	}()
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	for _, tc := range []struct {
		name  string
		hello proto.Hello
		fds   []int
		errno unix.Errno
	}{
		{"wrong pid", proto.Hello{PID: int32(os.Getpid() + 1), PageSize: 4096, Flags: proto.HelloUFFD}, []int{p[0]}, unix.EPERM},
		{"page size", proto.Hello{PID: int32(os.Getpid()), PageSize: 65536, Flags: proto.HelloUFFD}, []int{p[0]}, unix.EINVAL},
		{"tiny budget", proto.Hello{PID: int32(os.Getpid()), PageSize: 4096, Flags: proto.HelloUFFD, LocalMem: 4096}, []int{p[0]}, unix.EINVAL},
		{"no uffd", proto.Hello{PID: int32(os.Getpid()), PageSize: 4096}, nil, unix.EPROTO},
		{"not a uffd", proto.Hello{PID: int32(os.Getpid()), PageSize: 4096, Flags: proto.HelloUFFD}, []int{p[0]}, unix.EBADF},
		{"unknown fork", proto.Hello{PID: int32(os.Getpid()), PPID: 1, ForkSerial: 7, PageSize: 4096}, nil, unix.ENOENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := proto.Dial(sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := proto.Send(c, nil, 1, &tc.hello, tc.fds...); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, proto.MaxPacket)
			var fds [proto.MaxFDs]int
			pkt, _, err := proto.Recv(c, buf, make([]byte, proto.OOBSize), fds[:])
			if err != nil {
				t.Fatal(err)
			}
			var w proto.Welcome
			_, err = proto.Expect(pkt, &w)
			if !errors.Is(err, tc.errno) {
				t.Fatalf("got %v, want %v", err, tc.errno)
			}
		})
	}
	// Garbage: the connection is closed, the agent keeps serving.
	c, err := proto.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("not a packet"))
	buf := make([]byte, proto.MaxPacket)
	c.Read(buf)
	c.Close()
	if len(a.Stats()) != 0 {
		t.Fatalf("refused clients registered: %+v", a.Stats())
	}
}

// TestHandoffOnce: a HANDOFF made on a connection of its own (a process
// that is not a client, about to exec) is answered for the sender's own
// pid only, then the connection ends; with no shared memory paged there is
// nothing to release.
func TestHandoffOnce(t *testing.T) {
	store := pagertest.New(t, pagertest.Options{})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	a := startAgentOpts(t, pager.Options{Socket: sock, Store: store, LocalMem: 1 << 20})
	for _, tc := range []struct {
		name  string
		pid   int
		errno unix.Errno // 0: ACK
	}{
		{"own", os.Getpid(), 0},
		{"another's", os.Getpid() + 1, unix.EPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := proto.Dial(sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			m := proto.Handoff{PID: int32(tc.pid), Flags: proto.HandoffExec, N: 1, FDs: [proto.HandoffMaxFDs]int32{0}}
			if err := proto.Send(c, nil, 7, &m); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, proto.MaxPacket)
			pkt, _, err := proto.Recv(c, buf, make([]byte, proto.OOBSize), nil)
			if err != nil {
				t.Fatal(err)
			}
			var ack proto.Ack
			_, err = proto.Expect(pkt, &ack)
			switch {
			case tc.errno == 0 && (err != nil || ack.Seq != 7):
				t.Fatalf("got %+v %v, want ACK of 7", ack, err)
			case tc.errno != 0 && !errors.Is(err, tc.errno):
				t.Fatalf("got %v, want %v", err, tc.errno)
			}
			if _, _, err := proto.Recv(c, buf, make([]byte, proto.OOBSize), nil); err == nil {
				t.Fatal("the connection goes on after the answer")
			}
		})
	}
	if len(a.Stats()) != 0 {
		t.Fatalf("a HANDOFF registered a client: %+v", a.Stats())
	}
}
