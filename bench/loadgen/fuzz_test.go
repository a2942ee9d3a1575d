package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"testing"
)

// consumed returns how many bytes of data r has read (r over data alone).
func consumed(data []byte, r *bufio.Reader, src *bytes.Reader) int {
	return len(data) - src.Len() - r.Buffered()
}

// checkValue checks the invariants of a parsed value: it fits in dst, it
// is dst's own memory, it is the bytes of the reply just before the CRLF
// (and the trailer) that end what was consumed.
func checkValue(t *testing.T, data []byte, n int, v, dst []byte, trailer string) {
	if len(v) > len(dst) {
		t.Fatalf("a value of %d bytes in a buffer of %d", len(v), len(dst))
	}
	if len(v) > 0 && &v[0] != &dst[0] {
		t.Fatal("the value is not in dst")
	}
	end := n - len(trailer) - 2
	if end < len(v) || !bytes.Equal(data[end-len(v):end], v) || string(data[end:n]) != "\r\n"+trailer {
		t.Fatalf("value %q is not the reply's bytes before its end (%q)", v, data[:n])
	}
}

func FuzzRedisReply(f *testing.F) {
	for _, s := range []string{"$5\r\nhello\r\n", "$-1\r\n", "-ERR x\r\n", "+OK\r\n", "$0\r\n\r\n", "$3\r\nab", ":1\r\n", "$99\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		r := bufio.NewReaderSize(src, 64)
		dst := make([]byte, 32)
		v, err := readRedisBulk(r, dst)
		if err != nil {
			if v != nil {
				t.Fatalf("a value %q with error %v", v, err)
			}
			return
		}
		checkValue(t, data, consumed(data, r, src), v, dst, "")
		if data[0] != '$' {
			t.Fatalf("a value from a reply that is no bulk string: %q", data)
		}
		// The status reader takes only what it asked for.
		src = bytes.NewReader(data)
		if err := readRedisStatus(bufio.NewReaderSize(src, 64), "OK"); err == nil {
			t.Fatalf("%q is a bulk string and +OK", data)
		}
	})
}

func FuzzMemcacheReply(f *testing.F) {
	for _, s := range []string{"VALUE k 0 5\r\nhello\r\nEND\r\n", "END\r\n", "VALUE k 1 0 7\r\n\r\nEND\r\n", "SERVER_ERROR x\r\n",
		"VALUE k 0 5\r\nhel", "VALUE q 0 1\r\na\r\nEND\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		r := bufio.NewReaderSize(src, 64)
		dst := make([]byte, 32)
		v, err := readMemcacheValue(r, []byte("k"), dst)
		if err != nil {
			if v != nil {
				t.Fatalf("a value %q with error %v", v, err)
			}
			var se ServerError
			if errors.Is(err, ErrMiss) && !bytes.HasPrefix(data, []byte("END\r\n")) || errors.As(err, &se) && bytes.HasPrefix(data, []byte("VALUE ")) {
				t.Fatalf("%q: %v", data, err)
			}
			return
		}
		checkValue(t, data, consumed(data, r, src), v, dst, "END\r\n")
		if !bytes.HasPrefix(data, []byte("VALUE k ")) {
			t.Fatalf("a value from a reply for another key: %q", data)
		}
	})
}
