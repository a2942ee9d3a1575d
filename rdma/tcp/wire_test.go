package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"rmem/rdma"
	"rmem/spin"
)

func validRequest(op rdma.Opcode, n int) []byte {
	b := make([]byte, reqSize)
	wr := rdma.WorkRequest{Op: op, Key: rdma.Key{1, 2, 3}, Offset: 4096, Local: make([]byte, n), Compare: 5, Swap: 6, Add: 7}
	putRequest(b, 42, &wr)
	return b
}

func TestRequestRoundTrip(t *testing.T) {
	for _, op := range []rdma.Opcode{rdma.OpRead, rdma.OpWrite, rdma.OpCompareSwap, rdma.OpFetchAdd} {
		b := validRequest(op, 4096)
		r, err := decodeRequest(b)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		wantLen := uint32(4096)
		if op.IsAtomic() {
			wantLen = 8
		}
		if r.Op != op || r.ID != 42 || r.Offset != 4096 || r.Length != wantLen || r.Key != (rdma.Key{1, 2, 3}) {
			t.Fatalf("%s: decoded %+v", op, r)
		}
		if op == rdma.OpFetchAdd && r.Operand != 7 || op == rdma.OpCompareSwap && (r.Compare != 5 || r.Operand != 6) {
			t.Fatalf("%s: operands %+v", op, r)
		}
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	mut := func(f func(b []byte)) []byte {
		b := validRequest(rdma.OpWrite, 4096)
		f(b)
		return b
	}
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"short":         {validRequest(rdma.OpRead, 1)[:reqSize-1], rdma.ErrProtocol},
		"version 0":     {mut(func(b []byte) { b[0] = 0 }), rdma.ErrVersion},
		"version 2":     {mut(func(b []byte) { b[0] = 2 }), rdma.ErrVersion},
		"opcode 0":      {mut(func(b []byte) { b[1] = 0 }), rdma.ErrProtocol},
		"opcode 5":      {mut(func(b []byte) { b[1] = 5 }), rdma.ErrProtocol},
		"flags":         {mut(func(b []byte) { b[2] = 1 }), rdma.ErrProtocol},
		"oversize":      {mut(func(b []byte) { b[4], b[5], b[6], b[7] = 1, 0, 0x10, 0 }), rdma.ErrProtocol},
		"huge":          {mut(func(b []byte) { b[4], b[5], b[6], b[7] = 0xff, 0xff, 0xff, 0xff }), rdma.ErrProtocol},
		"atomic len 16": {mut(func(b []byte) { b[1] = byte(rdma.OpFetchAdd); b[4] = 16 }), rdma.ErrProtocol},
		"atomic len 0":  {mut(func(b []byte) { b[1] = byte(rdma.OpCompareSwap); b[4], b[5] = 0, 0 }), rdma.ErrProtocol},
	}
	for name, tc := range cases {
		if _, err := decodeRequest(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// Exactly MaxTransfer is fine.
	b := mut(func(b []byte) { b[4], b[5], b[6], b[7] = 0, 0, 0x10, 0 })
	if _, err := decodeRequest(b); err != nil {
		t.Errorf("MaxTransfer: %v", err)
	}
}

func TestDecodeReplyChecksRequest(t *testing.T) {
	b := make([]byte, replySize)
	putReply(b, reply{Op: rdma.OpRead, Status: rdma.StatusOK, Length: 4096, ID: 7})
	if _, err := decodeReply(b, 7, rdma.OpRead, 4096); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string]struct {
		id  uint64
		op  rdma.Opcode
		len int
	}{
		"id": {8, rdma.OpRead, 4096}, "op": {7, rdma.OpWrite, 4096}, "len": {7, rdma.OpRead, 4095},
	} {
		if _, err := decodeReply(b, args.id, args.op, args.len); !errors.Is(err, rdma.ErrProtocol) {
			t.Errorf("%s mismatch: %v", name, err)
		}
	}
	putReply(b, reply{Op: rdma.OpRead, Status: rdma.StatusOutOfBounds, Length: 4096, ID: 7})
	if _, err := decodeReply(b, 7, rdma.OpRead, 4096); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("error reply with payload accepted: %v", err)
	}
	putReply(b, reply{Op: rdma.OpRead, Status: rdma.StatusTransport, ID: 7})
	if _, err := decodeReply(b, 7, rdma.OpRead, 4096); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("transport status from the wire accepted: %v", err)
	}
}

// FuzzDecodeRequest checks invariants of the server's frame decoder: it
// never panics, accepts only bounded lengths and known opcodes, and what it
// accepts re-encodes to the same bytes.
func FuzzDecodeRequest(f *testing.F) {
	for _, op := range []rdma.Opcode{rdma.OpRead, rdma.OpWrite, rdma.OpCompareSwap, rdma.OpFetchAdd} {
		f.Add(validRequest(op, 4096))
	}
	f.Add(validRequest(rdma.OpRead, rdma.MaxTransfer))
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, reqSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			if !errors.Is(err, rdma.ErrProtocol) && !errors.Is(err, rdma.ErrVersion) {
				t.Fatalf("error %v is neither ErrProtocol nor ErrVersion", err)
			}
			return
		}
		if !r.Op.Valid() || r.Length > rdma.MaxTransfer || r.Op.IsAtomic() && r.Length != rdma.AtomicSize {
			t.Fatalf("accepted %+v", r)
		}
		wr := rdma.WorkRequest{Op: r.Op, Key: r.Key, Offset: r.Offset, Compare: r.Compare}
		if !r.Op.IsAtomic() {
			wr.Local = make([]byte, r.Length)
		}
		wr.Swap, wr.Add = r.Operand, r.Operand
		out := make([]byte, reqSize)
		putRequest(out, r.ID, &wr)
		if !bytes.Equal(out, b[:reqSize]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b[:reqSize], out)
		}
	})
}

// FuzzDecodeReply checks the client's reply decoder.
func FuzzDecodeReply(f *testing.F) {
	b := make([]byte, replySize)
	putReply(b, reply{Op: rdma.OpRead, Status: rdma.StatusOK, Length: 4096, ID: 3})
	f.Add(b, uint64(3), uint8(rdma.OpRead), uint32(4096))
	putReply(b, reply{Op: rdma.OpFetchAdd, Status: rdma.StatusOK, Length: 8, ID: 3, Value: 9})
	f.Add(b, uint64(3), uint8(rdma.OpFetchAdd), uint32(0))
	putReply(b, reply{Op: rdma.OpWrite, Status: rdma.StatusPermission, ID: 1})
	f.Add(b, uint64(1), uint8(rdma.OpWrite), uint32(10))
	f.Fuzz(func(t *testing.T, b []byte, id uint64, op uint8, localLen uint32) {
		localLen %= rdma.MaxTransfer + 1
		r, err := decodeReply(b, id, rdma.Opcode(op), int(localLen))
		if err != nil {
			return
		}
		if r.ID != id || r.Op != rdma.Opcode(op) || !r.Status.Valid() || r.Status == rdma.StatusTransport {
			t.Fatalf("accepted mismatching reply %+v", r)
		}
		if r.Status != rdma.StatusOK && r.Length != 0 || r.Op == rdma.OpRead && r.Status == rdma.StatusOK && r.Length != localLen {
			t.Fatalf("accepted reply with bad length %+v", r)
		}
	})
}

// FuzzDecodeHello checks the handshake decoder.
func FuzzDecodeHello(f *testing.F) {
	b := make([]byte, helloSize)
	putHello(b, hello{Version: version, MaxTransfer: rdma.MaxTransfer})
	f.Add(b)
	f.Add([]byte("RMRD"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b)
		if err != nil {
			return
		}
		out := make([]byte, helloSize)
		putHello(out, h)
		if !bytes.Equal(out[:4], b[:4]) || !bytes.Equal(out[4:6], b[4:6]) || !bytes.Equal(out[8:12], b[8:12]) {
			t.Fatalf("hello %x re-encodes as %x", b[:helloSize], out)
		}
	})
}

// FuzzClientReplies feeds arbitrary reply bytes to a client with four
// requests outstanding: every request completes exactly once, in order,
// and nothing is written outside the READ buffers.
func FuzzClientReplies(f *testing.F) {
	key := rdma.Key{7}
	reply1 := func(op rdma.Opcode, st rdma.Status, n uint32, id uint64, payload int) []byte {
		b := make([]byte, replySize)
		putReply(b, reply{Op: op, Status: st, Length: n, ID: id, Value: 9})
		return append(b, bytes.Repeat([]byte{0xAB}, payload)...)
	}
	good := bytes.Join([][]byte{
		reply1(rdma.OpRead, rdma.StatusOK, 16, 0, 16),
		reply1(rdma.OpWrite, rdma.StatusOK, 8, 1, 0),
		reply1(rdma.OpFetchAdd, rdma.StatusOK, 8, 2, 0),
		reply1(rdma.OpRead, rdma.StatusOK, 40, 3, 40),
	}, nil)
	f.Add(good)
	f.Add(bytes.Join([][]byte{
		reply1(rdma.OpRead, rdma.StatusOutOfBounds, 0, 0, 0),
		reply1(rdma.OpWrite, rdma.StatusOK, 8, 1, 0),
		reply1(rdma.OpFetchAdd, rdma.StatusMisaligned, 0, 2, 0),
		reply1(rdma.OpRead, rdma.StatusOK, 40, 3, 40),
	}, nil))
	f.Add(good[:50])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		cli, srv := net.Pipe()
		c, err := newConn(cli, 8, spin.New(spin.DefaultMax, nil), false)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const guard = 64
		arena := bytes.Repeat([]byte{0x5C}, 3*guard+16+40)
		r1 := arena[guard : guard+16 : guard+16]
		r2 := arena[2*guard+16 : 2*guard+16+40 : 2*guard+16+40]
		wrs := []rdma.WorkRequest{
			{ID: 10, Op: rdma.OpRead, Key: key, Local: r1},
			{ID: 11, Op: rdma.OpWrite, Key: key, Local: make([]byte, 8)},
			{ID: 12, Op: rdma.OpFetchAdd, Key: key},
			{ID: 13, Op: rdma.OpRead, Key: key, Local: r2},
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			io.CopyN(io.Discard, srv, 4*reqSize+8)
			srv.Write(data)
			srv.Close()
		}()
		if err := c.Post(wrs); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cq := make([]rdma.Completion, 4)
		for got := 0; got < 4; {
			n, err := c.Wait(ctx, cq[got:])
			if err != nil {
				t.Fatalf("after %d completions: %v", got, err)
			}
			for i, ce := range cq[got : got+n] {
				if ce.ID != uint64(10+got+i) || !ce.Status.Valid() {
					t.Fatalf("completion %d: %+v", got+i, ce)
				}
			}
			got += n
		}
		c.Close() // unblocks the writer if the data had bytes past the replies
		<-done
		for i, b := range arena {
			inside := (i >= guard && i < guard+16) || (i >= 2*guard+16 && i < 2*guard+16+40)
			if !inside && b != 0x5C {
				t.Fatalf("byte %d outside the READ buffers changed", i)
			}
		}
	})
}
