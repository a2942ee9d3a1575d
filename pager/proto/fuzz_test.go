package proto

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzDecode checks the decoder's invariants on arbitrary packets: it never
// panics, a decoded message re-encodes to exactly the same bytes, and
// decoding that again gives the same message.
func FuzzDecode(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(m.Encode(nil, 3))
	}
	f.Add([]byte{})
	f.Add([]byte("RMEM"))
	f.Add(append(appendHeader(nil, TypeEvict, 0, 16), make([]byte, 16)...))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		h, m, err := Decode(pkt)
		if err != nil {
			if m != nil {
				t.Fatalf("error %v with a message", err)
			}
			return
		}
		if m.Type() != h.Type {
			t.Fatalf("header %v, message %v", h.Type, m.Type())
		}
		again := m.Encode(nil, h.Seq)
		if !bytes.Equal(again, pkt) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", pkt, again)
		}
		h2, m2, err := Decode(again)
		if err != nil || h2 != h || !reflect.DeepEqual(m, m2) {
			t.Fatalf("second decode: %+v %+v %v", h2, m2, err)
		}
	})
}
