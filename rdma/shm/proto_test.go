package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
)

func FuzzDecodeRequest(f *testing.F) {
	b := make([]byte, reqSize)
	putRequest(b, request{Op: opMap, Key: rdma.Key{1}})
	f.Add(append([]byte(nil), b...))
	putRequest(b, request{Op: opUnmap, Slot: 3})
	f.Add(append([]byte(nil), b...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			if !errors.Is(err, rdma.ErrProtocol) {
				t.Fatal(err)
			}
			return
		}
		if r.Op == opUnmap && r.Slot >= numSlots {
			t.Fatalf("accepted slot %d", r.Slot)
		}
		out := make([]byte, reqSize)
		putRequest(out, r)
		if !bytes.Equal(out, b) {
			t.Fatalf("%x re-encodes as %x", b, out)
		}
	})
}

func FuzzDecodeMapReply(f *testing.F) {
	b := make([]byte, replySize)
	putMapReply(b, mapReply{Status: rdma.StatusOK, Access: rdma.AccessRead, Slot: 1, Offset: 4096, Length: 1 << 26})
	f.Add(append([]byte(nil), b...))
	putMapReply(b, mapReply{Status: rdma.StatusRevokedKey})
	f.Add(append([]byte(nil), b...))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeMapReply(b)
		if err != nil {
			return
		}
		if r.Status == rdma.StatusOK && (!r.Access.Valid() || r.Slot >= numSlots || r.Length == 0 || r.Offset+r.Length < r.Offset) {
			t.Fatalf("accepted %+v", r)
		}
		if !r.Status.Valid() || r.Status == rdma.StatusTransport {
			t.Fatalf("accepted status %d", r.Status)
		}
	})
}

// TestBadInputLiveServer sends malformed packets to a live shm server:
// the connection closes, other clients keep working.
func TestBadInputLiveServer(t *testing.T) {
	d, r, path := serve(t)
	k, _ := d.IssueKey(r, 0, 4096, rdma.AccessReadWrite)
	good, err := Dial(context.Background(), path, rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	hello := make([]byte, helloSize)
	putHello(hello)
	req := func(op byte, slot uint32) []byte {
		b := make([]byte, reqSize)
		b[0] = op
		binary.LittleEndian.PutUint32(b[4:], slot)
		return b
	}
	cases := map[string][][]byte{
		"bad magic":     {[]byte("HTTP/1.1")},
		"short hello":   {hello[:5]},
		"long hello":    {append(append([]byte(nil), hello...), 0)},
		"bad op":        {hello, req(9, 0)},
		"short request": {hello, req(opMap, 0)[:10]},
		"unmap slot":    {hello, req(opUnmap, numSlots)},
		"reserved":      {hello, func() []byte { b := req(opMap, 0); b[2] = 1; return b }()},
	}
	for name, pkts := range cases {
		t.Run(name, func(t *testing.T) {
			nc, err := net.Dial("unixpacket", path)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			for _, p := range pkts {
				nc.Write(p)
			}
			nc.SetReadDeadline(time.Now().Add(20 * time.Second))
			buf := make([]byte, 64)
			oob := make([]byte, 64)
			for {
				n, oobn, _, _, err := nc.(*net.UnixConn).ReadMsgUnix(buf, oob)
				if err != nil || n == 0 {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						t.Fatal("server did not close the connection")
					}
					return
				}
				if oobn > 0 { // the hello's control fd
					fd, err := takeFd(oob[:oobn])
					if err == nil {
						unix.Close(fd)
					}
				}
			}
		})
		if err := rdma.Write(context.Background(), good, k, 0, []byte(name)); err != nil {
			t.Fatalf("good client after %q: %v", name, err)
		}
	}
}
