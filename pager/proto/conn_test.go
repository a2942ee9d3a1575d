package proto

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns a connected SOCK_SEQPACKET pair through a real listener.
func pair(t *testing.T) (client, server *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestSendRecvWithFDs(t *testing.T) {
	client, server := pair(t)
	memfd, err := unix.MemfdCreate("staging", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memfd)
	if _, err := unix.Write(memfd, []byte("staged")); err != nil {
		t.Fatal(err)
	}
	sbuf := make([]byte, 0, MaxPacket)
	w := &Welcome{ClientID: 3, MinAlloc: 1 << 20, StagingSlots: 8}
	if err := Send(server, sbuf, 11, w, memfd); err != nil {
		t.Fatal(err)
	}

	buf, oob := make([]byte, MaxPacket), make([]byte, OOBSize)
	fds := make([]int, MaxFDs)
	pkt, nfds, err := Recv(client, buf, oob, fds)
	if err != nil || nfds != 1 {
		t.Fatalf("Recv = %d fds, %v", nfds, err)
	}
	defer unix.Close(fds[0])
	var got Welcome
	h, err := Expect(pkt, &got)
	if err != nil || got != *w || h.Seq != 11 {
		t.Fatalf("Expect = %+v %+v %v", h, got, err)
	}
	b := make([]byte, 6)
	if _, err := unix.Pread(fds[0], b, 0); err != nil || string(b) != "staged" {
		t.Fatalf("received fd reads %q, %v: not the memfd", b, err)
	}
	if fl, _ := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
		t.Errorf("received fd is not close-on-exec")
	}

	// Packets stay packets: two sends, two receives.
	for i := range 2 {
		if err := Send(client, sbuf, uint32(i), &Ack{Seq: uint32(100 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		pkt, _, err := Recv(server, buf, oob, fds[:0])
		var a Ack
		if _, err2 := Expect(pkt, &a); err != nil || err2 != nil || a.Seq != uint32(100+i) {
			t.Fatalf("packet %d: %+v %v %v", i, a, err, err2)
		}
	}
}

func TestRecvTooManyFDs(t *testing.T) {
	client, server := pair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	h := &Hello{PID: 1, PageSize: 4096, Flags: HelloUFFD}
	if err := Send(client, nil, 1, h, int(r.Fd()), int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	fds := make([]int, 1)
	_, _, err = Recv(server, make([]byte, MaxPacket), make([]byte, OOBSize), fds)
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("Recv of 2 fds into room for 1 = %v, want ErrTruncated", err)
	}
}

func TestRecvTruncatedPacket(t *testing.T) {
	client, server := pair(t)
	if err := Send(client, nil, 1, &Hello{PID: 1, PageSize: 4096, Flags: HelloUFFD}); err != nil {
		t.Fatal(err)
	}
	_, _, err := Recv(server, make([]byte, 20), make([]byte, OOBSize), nil)
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("Recv into a 20-byte buffer = %v, want ErrTruncated", err)
	}
}

func TestRecvEOF(t *testing.T) {
	client, server := pair(t)
	client.Close()
	_, _, err := Recv(server, make([]byte, MaxPacket), make([]byte, OOBSize), nil)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after peer close = %v, want io.EOF", err)
	}
}
