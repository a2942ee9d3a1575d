package verbs

import (
	"bytes"
	"errors"
	"testing"

	"rmem/rdma"
)

func TestProtoRoundTrip(t *testing.T) {
	ep := endpoint{QPN: 0x123456, PSN: 0xabcdef, LID: 7, MTU: 3, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 15}, Depth: 128}
	k := rdma.Key{1, 2, 3}
	for _, m := range []msg{
		{Type: msgHello, EP: ep},
		{Type: msgWelcome, EP: endpoint{QPN: 17, PSN: 1, MTU: 5}},
		{Type: msgReconnect, EP: ep},
		{Type: msgReconnected, EP: endpoint{QPN: 18, MTU: 1}},
		{Type: msgResolve, Key: k},
		{Type: msgGrant, G: grant{Status: rdma.StatusOK, Access: rdma.AccessRead, RKey: 0x99, Addr: 1 << 40, Len: 64 << 20, Key: k}},
		{Type: msgGrant, G: grant{Status: rdma.StatusRevokedKey, Key: k}},
	} {
		var b [msgSize]byte
		encode(b[:], &m)
		got, err := decode(b[:])
		if err != nil || got != m {
			t.Fatalf("%s: decoded %+v, %v; want %+v", m.Type, got, err, m)
		}
	}
}

func TestProtoRejects(t *testing.T) {
	good := func() []byte {
		var b [msgSize]byte
		encode(b[:], &msg{Type: msgHello, EP: endpoint{QPN: 5, MTU: 3, Depth: 8}})
		return b[:]
	}
	for name, tc := range map[string]struct {
		mut  func(b []byte) []byte
		want error
	}{
		"short":        {func(b []byte) []byte { return b[:10] }, rdma.ErrProtocol},
		"magic":        {func(b []byte) []byte { b[0] = 'X'; return b }, rdma.ErrProtocol},
		"version":      {func(b []byte) []byte { b[4] = 2; return b }, rdma.ErrVersion},
		"type":         {func(b []byte) []byte { b[5] = 99; return b }, rdma.ErrProtocol},
		"qpn 0":        {func(b []byte) []byte { clear(b[8:12]); return b }, rdma.ErrProtocol},
		"qpn 25 bits":  {func(b []byte) []byte { b[11] = 1; return b }, rdma.ErrProtocol},
		"mtu":          {func(b []byte) []byte { b[18] = 6; return b }, rdma.ErrProtocol},
		"depth 0":      {func(b []byte) []byte { clear(b[36:40]); return b }, rdma.ErrProtocol},
		"depth huge":   {func(b []byte) []byte { b[39] = 1; return b }, rdma.ErrProtocol},
		"hello status": {func(b []byte) []byte { b[6] = 1; return b }, rdma.ErrProtocol},
	} {
		if _, err := decode(tc.mut(good())); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	var b [msgSize]byte
	encode(b[:], &msg{Type: msgGrant, G: grant{Status: rdma.StatusOK, Access: rdma.AccessReadWrite, Addr: ^uint64(0) - 10, Len: 4096}})
	if _, err := decode(b[:]); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("grant whose range wraps: %v", err)
	}
	encode(b[:], &msg{Type: msgGrant, G: grant{Status: rdma.StatusTransport}})
	if _, err := decode(b[:]); !errors.Is(err, rdma.ErrProtocol) {
		t.Errorf("grant with status Transport: %v", err)
	}
}

// FuzzDecode checks that decode never panics, and that whatever it accepts
// encodes back to the same bytes (no field is silently dropped).
func FuzzDecode(f *testing.F) {
	var b [msgSize]byte
	encode(b[:], &msg{Type: msgHello, EP: endpoint{QPN: 5, PSN: 9, MTU: 3, Depth: 8}})
	f.Add(bytes.Clone(b[:]))
	encode(b[:], &msg{Type: msgGrant, G: grant{Status: rdma.StatusOK, Access: rdma.AccessRead, RKey: 3, Addr: 4096, Len: 4096}})
	f.Add(bytes.Clone(b[:]))
	encode(b[:], &msg{Type: msgResolve, Key: rdma.Key{9}})
	f.Add(bytes.Clone(b[:]))
	f.Add([]byte("RMVB"))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := decode(in)
		if err != nil {
			return
		}
		var out [msgSize]byte
		encode(out[:], &m)
		// Reserved bytes are not checked on input; compare the fields.
		again, err := decode(out[:])
		if err != nil || again != m {
			t.Fatalf("re-decoding %+v: %+v, %v", m, again, err)
		}
	})
}
