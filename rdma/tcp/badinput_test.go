package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
	"rmem/spin"
)

const (
	canarySize = 64 << 10
	guardedLen = 1 << 20
)

// guardedDomain registers a 1 MiB region with 64 KiB canaries on both sides
// and returns the whole mapping; canary bytes are 0xCC.
func guardedDomain(t testing.TB) (*rdma.Domain, *rdma.Region, []byte) {
	all, err := unix.Mmap(-1, 0, guardedLen+2*canarySize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for i := range all {
		all[i] = 0xCC
	}
	r := rdma.NewRegion(all[canarySize : canarySize+guardedLen])
	d := rdma.NewDomain(rdma.DomainOptions{})
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Deregister(context.Background(), r)
		unix.Munmap(all)
	})
	return d, r, all
}

func checkCanary(t testing.TB, all []byte) {
	t.Helper()
	for _, c := range [][]byte{all[:canarySize], all[canarySize+guardedLen:]} {
		for i, b := range c {
			if b != 0xCC {
				t.Fatalf("byte %d of a canary outside the registered region changed to %#x", i, b)
			}
		}
	}
}

func rawHello(t *testing.T, addr string, ver uint16) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var b [helloSize]byte
	putHello(b[:], hello{Version: ver, MaxTransfer: rdma.MaxTransfer})
	if _, err := nc.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	return nc
}

// expectClosed reads until the server closes the connection.
func expectClosed(t *testing.T, nc net.Conn, what string) []byte {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(20 * time.Second)) // hang guard
	got, err := io.ReadAll(nc)
	nc.Close()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: server did not close the connection", what)
	}
	return got
}

func TestBadInputLiveServer(t *testing.T) {
	d, r, all := guardedDomain(t)
	l, err := Listen("127.0.0.1:0", d, rdma.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	half := uint64(guardedLen / 2)
	attackKey, _ := d.IssueKey(r, 0, half, rdma.AccessReadWrite)
	goodKey, _ := d.IssueKey(r, half, half, rdma.AccessReadWrite)

	// A well-behaved client keeps working throughout, and its data stays intact.
	ctx, cancel := context.WithCancel(context.Background())
	good, err := Dial(ctx, l.Addr(), rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	var wg sync.WaitGroup
	goodErr := make(chan error, 1)
	wg.Go(func() {
		buf, back := make([]byte, 4096), make([]byte, 4096)
		for i := uint64(0); ctx.Err() == nil; i++ {
			binary.LittleEndian.PutUint64(buf, i)
			off := i % 128 * 4096
			if err := rdma.Write(ctx, good, goodKey, off, buf); err != nil {
				goodErr <- err
				return
			}
			if err := rdma.Read(ctx, good, goodKey, off, back); err != nil {
				goodErr <- err
				return
			}
			if !bytes.Equal(buf, back) {
				goodErr <- io.ErrUnexpectedEOF
				return
			}
		}
	})
	defer func() {
		cancel()
		wg.Wait()
		select {
		case err := <-goodErr:
			if ctx.Err() == nil || err != context.Canceled {
				t.Errorf("well-behaved client failed: %v", err)
			}
		default:
		}
	}()

	req := func(op rdma.Opcode, k rdma.Key, off uint64, n int) []byte {
		b := make([]byte, reqSize)
		wr := rdma.WorkRequest{Op: op, Key: k, Offset: off, Local: make([]byte, n)}
		putRequest(b, 0, &wr)
		return b
	}
	t.Run("garbage before hello", func(t *testing.T) {
		nc, _ := net.Dial("tcp", l.Addr())
		nc.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 100))
		if got := expectClosed(t, nc, "garbage"); len(got) != 0 {
			t.Fatalf("server answered garbage with %q", got)
		}
	})
	t.Run("wrong hello version", func(t *testing.T) {
		nc := rawHello(t, l.Addr(), 9)
		got := expectClosed(t, nc, "version 9")
		h, err := decodeHello(got)
		if err != nil || h.Version != version {
			t.Fatalf("server's answer to version 9: %x (%v)", got, err)
		}
	})
	t.Run("client sees version mismatch", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var b [helloSize]byte
			io.ReadFull(c, b[:])
			putHello(b[:], hello{Version: 7})
			c.Write(b[:])
			c.Close()
		}()
		if _, err := Dial(context.Background(), ln.Addr().String(), rdma.DialOptions{}); !errors.Is(err, rdma.ErrVersion) {
			t.Fatalf("dial of a version-7 server: %v", err)
		}
	})
	cases := map[string][]byte{
		"garbage after hello":  bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1000),
		"truncated header":     req(rdma.OpRead, attackKey, 0, 16)[:30],
		"truncated payload":    append(req(rdma.OpWrite, attackKey, 0, 4096), make([]byte, 100)...),
		"oversize length":      append(req(rdma.OpWrite, attackKey, 0, 0), bytes.Repeat([]byte{1}, 1000)...),
		"wrong frame version":  func() []byte { b := req(rdma.OpRead, attackKey, 0, 16); b[0] = 2; return b }(),
		"bad opcode":           func() []byte { b := req(rdma.OpRead, attackKey, 0, 16); b[1] = 77; return b }(),
		"nonzero flags":        func() []byte { b := req(rdma.OpRead, attackKey, 0, 16); b[3] = 1; return b }(),
		"atomic with length 9": func() []byte { b := req(rdma.OpFetchAdd, attackKey, 0, 0); b[4] = 9; return b }(),
	}
	// "oversize length": patch the length to MaxTransfer+1.
	binary.LittleEndian.PutUint32(cases["oversize length"][4:], rdma.MaxTransfer+1)
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			nc := rawHello(t, l.Addr(), version)
			nc.Write(b)
			if name == "truncated header" || name == "truncated payload" {
				nc.(*net.TCPConn).CloseWrite()
			}
			got := expectClosed(t, nc, name)
			if len(got) < helloSize {
				t.Fatalf("no hello back")
			}
			if rest := got[helloSize:]; len(rest) != 0 {
				t.Fatalf("server answered a malformed frame with %x", rest)
			}
			checkCanary(t, all)
		})
	}
	t.Run("bad ops keep the connection", func(t *testing.T) {
		nc := rawHello(t, l.Addr(), version)
		defer nc.Close()
		var stream []byte
		stream = append(stream, req(rdma.OpWrite, attackKey, half-100, 4096)...) // out of bounds: payload discarded
		stream = append(stream, bytes.Repeat([]byte{0xAB}, 4096)...)
		stream = append(stream, req(rdma.OpWrite, goodKey, math.MaxUint64-10, 4096)...)
		stream = append(stream, bytes.Repeat([]byte{0xAB}, 4096)...)
		stream = append(stream, req(rdma.OpRead, rdma.Key{9}, 0, 4096)...)
		stream = append(stream, req(rdma.OpFetchAdd, attackKey, 3, 8)...)
		stream = append(stream, req(rdma.OpRead, attackKey, 0, 8)...)
		nc.Write(stream)
		nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		got := make([]byte, helloSize+5*replySize+8)
		if _, err := io.ReadFull(nc, got); err != nil {
			t.Fatalf("replies: %v", err)
		}
		want := []rdma.Status{rdma.StatusOutOfBounds, rdma.StatusOutOfBounds, rdma.StatusUnknownKey, rdma.StatusMisaligned, rdma.StatusOK}
		for i, st := range want {
			if s := rdma.Status(got[helloSize+i*replySize+2]); s != st {
				t.Fatalf("reply %d: status %s, want %s", i, s, st)
			}
		}
		checkCanary(t, all)
	})
	t.Run("mutated streams", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		iters := 300
		if testing.Short() {
			iters = 50
		}
		for it := range iters {
			var stream []byte
			for range 1 + rng.IntN(8) {
				op := rdma.Opcode(1 + rng.IntN(4))
				k := attackKey
				if rng.IntN(8) == 0 {
					k = rdma.Key{byte(rng.Uint32())}
				}
				off := half - uint64(rng.IntN(8192))
				if rng.IntN(4) == 0 {
					off = rng.Uint64()
				}
				n := rng.IntN(8192)
				stream = append(stream, req(op, k, off, n)...)
				if op == rdma.OpWrite {
					stream = append(stream, bytes.Repeat([]byte{0xEE}, n)...)
				}
			}
			for range rng.IntN(4) {
				stream[rng.IntN(len(stream))] = byte(rng.Uint32())
			}
			if rng.IntN(3) == 0 {
				stream = stream[:rng.IntN(len(stream))]
			}
			nc := rawHello(t, l.Addr(), version)
			go func() {
				nc.Write(stream)
				nc.(*net.TCPConn).CloseWrite()
			}()
			expectClosed(t, nc, "mutated stream")
			if it%50 == 0 {
				checkCanary(t, all)
			}
		}
		checkCanary(t, all)
	})
	select {
	case err := <-goodErr:
		t.Fatalf("well-behaved client failed: %v", err)
	default:
	}
	if l.Conns() != 1 {
		// Only the good client remains (allow the server a moment to reap).
		deadline := time.Now().Add(10 * time.Second)
		for l.Conns() != 1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := l.Conns(); n != 1 {
			t.Fatalf("%d server connections left, want 1", n)
		}
	}
}

// FuzzServerStream feeds arbitrary bytes after a valid hello to a server
// connection and checks that nothing outside the registered region changes
// and the connection goroutine ends.
func FuzzServerStream(f *testing.F) {
	req := func(op rdma.Opcode, off uint64, n int) []byte {
		b := make([]byte, reqSize)
		wr := rdma.WorkRequest{Op: op, Offset: off, Local: make([]byte, n)}
		putRequest(b, 1, &wr)
		return b
	}
	f.Add(req(rdma.OpRead, 0, 4096))
	f.Add(append(req(rdma.OpWrite, guardedLen-8, 16), bytes.Repeat([]byte{1}, 16)...))
	f.Add(append(req(rdma.OpWrite, 0, 4096), bytes.Repeat([]byte{1}, 4096)...))
	f.Add(req(rdma.OpFetchAdd, guardedLen-8, 8))
	f.Add(req(rdma.OpCompareSwap, 1<<63, 8))
	d, r, all := guardedDomain(f)
	key, err := d.IssueKey(r, 0, guardedLen, rdma.AccessReadWrite)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Requests in the corpus carry the zero key; give them the real one
		// so that they reach the region.
		stream := append([]byte(nil), data...)
		for i := 0; i+reqSize <= len(stream); i += reqSize {
			if rdma.Key(stream[i+16:i+32]) == (rdma.Key{}) {
				copy(stream[i+16:i+32], key[:])
			}
		}
		cli, srv := net.Pipe()
		c := newServerConn(srv, d, spin.New(spin.DefaultMax, nil))
		done := make(chan struct{})
		go func() { c.routineServe(); close(done) }()
		go io.Copy(io.Discard, cli)
		var h [helloSize]byte
		putHello(h[:], hello{Version: version, MaxTransfer: rdma.MaxTransfer})
		cli.Write(h[:])
		cli.Write(stream)
		cli.Close()
		<-done
		checkCanary(t, all)
	})
}
