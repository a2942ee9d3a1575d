package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeyValue(t *testing.T) {
	var k [KeyLen]byte
	if got := string(Key(k[:], 42)); got != "key:000000042" {
		t.Errorf("Key(42) = %q", got)
	}
	if got := string(Key(k[:], MaxKeys-1)); got != "key:999999999" {
		t.Errorf("Key(max) = %q", got)
	}
	a, b := Value(make([]byte, 1024), 7), Value(make([]byte, 1024), 7)
	if !bytes.Equal(a, b) {
		t.Error("Value is not a function of the key")
	}
	if !bytes.HasPrefix(a, []byte("key:000000007:")) {
		t.Errorf("Value(7) starts %q", a[:20])
	}
	if c := Value(make([]byte, 1024), 8); bytes.Equal(a[KeyLen:], c[KeyLen:]) {
		t.Error("keys 7 and 8 have the same value past the key")
	}
	for _, c := range a {
		if c < ' ' || c > '~' {
			t.Fatalf("unprintable byte %#x in a value", c)
		}
	}
}

// run loads a fake server of protocol p and reads keys back from it.
func run(t *testing.T, p Protocol, alter func(string, []byte) []byte, keys Keys, requests int) (Result, error) {
	t.Helper()
	s := newFake(p)
	g, err := Open(context.Background(), Config{Protocol: p, Dial: s.Dial, Keys: 500, ValueSize: 1024, Conns: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Wait()
	defer g.Close()
	ld, err := g.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ld.Requests != 500 || ld.Latency.Count() != 500 {
		t.Fatalf("load: %d requests, %d timed; want 500", ld.Requests, ld.Latency.Count())
	}
	if len(s.data) != 500 {
		t.Fatalf("the server holds %d keys, want 500", len(s.data))
	}
	s.Alter = alter
	if keys == nil {
		z, _ := NewZipf(500, 0.99)
		keys = NewScrambled(z, 500, 1)
	}
	return g.Get(context.Background(), keys, requests)
}

func TestGet(t *testing.T) {
	for _, p := range []Protocol{Redis, Memcached} {
		t.Run(string(p), func(t *testing.T) {
			res, err := run(t, p, nil, nil, 1001)
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != 1001 || res.Latency.Count() != 1001 || res.Bad() != 0 || res.FirstWrong != "" {
				t.Errorf("%d requests, %d timed, %d wrong, %d missing (%s); want 1001, 1001, 0, 0",
					res.Requests, res.Latency.Count(), res.Wrong, res.Missing, res.FirstWrong)
			}
			if res.PerSecond() <= 0 {
				t.Error("no rate")
			}
		})
	}
}

// one always draws the same key.
type one uint64

func (k one) Next(*rand.Rand) uint64 { return uint64(k) }

func TestWrongValues(t *testing.T) {
	alter := func(key string, v []byte) []byte {
		switch key {
		case "key:000000007": // a page of zeros in the middle
			clear(v[512:])
		case "key:000000008": // another key's value
			return Value(v, 9)
		case "key:000000009":
			return nil
		case "key:000000010": // cut short
			return v[:100]
		}
		return v
	}
	for _, p := range []Protocol{Redis, Memcached} {
		for _, c := range []struct {
			key           uint64
			wrong, missed uint64
			says          string
		}{
			{7, 10, 0, "offset 512 of 1024 (512 zero bytes)"},
			{8, 10, 0, "offset 12 of 1024"},
			{9, 0, 10, "key:000000009: missing"},
			{10, 10, 0, "100 bytes, want 1024"},
			{11, 0, 0, ""},
		} {
			t.Run(string(p)+"/"+strconv.FormatUint(c.key, 10), func(t *testing.T) {
				res, err := run(t, p, alter, one(c.key), 10)
				if err != nil {
					t.Fatal(err)
				}
				if res.Wrong != c.wrong || res.Missing != c.missed || !strings.Contains(res.FirstWrong, c.says) {
					t.Errorf("%d wrong, %d missing, %q; want %d, %d, %q", res.Wrong, res.Missing, res.FirstWrong, c.wrong, c.missed, c.says)
				}
			})
		}
	}
}

// A server that stops answering: the phase ends when its context does,
// with the context's error.
func TestGetCanceled(t *testing.T) {
	var ends []net.Conn
	dial := func(context.Context) (net.Conn, error) {
		c, s := net.Pipe()
		ends = append(ends, s)
		go io.Copy(io.Discard, s) // reads requests, never answers
		return c, nil
	}
	g, err := Open(context.Background(), Config{Protocol: Redis, Dial: dial, Keys: 10, ValueSize: 100, Conns: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := g.Get(ctx, Uniform{N: 10}, 100); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want the context's deadline", err)
	}
	g.Close()
	g.Close()
	for _, s := range ends {
		s.Close()
	}
}

func TestConfig(t *testing.T) {
	dial := func(context.Context) (net.Conn, error) { return nil, errors.New("no") }
	for _, c := range []Config{
		{Protocol: Redis, Keys: 10, ValueSize: 100},
		{Protocol: Redis, Dial: dial, Keys: 1, ValueSize: 100},
		{Protocol: Redis, Dial: dial, Keys: 10, ValueSize: 5},
		{Protocol: "http", Dial: dial, Keys: 10, ValueSize: 100},
		{Protocol: Redis, Dial: dial, Keys: 10, ValueSize: 100, Conns: -1},
	} {
		if _, err := Open(context.Background(), c); err == nil || !strings.Contains(err.Error(), "Config") {
			t.Errorf("Open(%+v): %v, want a Config error", c, err)
		}
	}
	if _, err := Open(context.Background(), Config{Protocol: Redis, Dial: dial, Keys: 10, ValueSize: 100}); err == nil {
		t.Error("a dial that fails: no error")
	}
}

// loop is a reader that returns the same bytes forever.
type loop struct {
	b   []byte
	off int
}

func (l *loop) Read(p []byte) (int, error) {
	n := copy(p, l.b[l.off:])
	l.off = (l.off + n) % len(l.b)
	return n, nil
}

// A GET, its check and its timing allocate nothing.
func TestGetAllocs(t *testing.T) {
	const size = 1024
	val := Value(make([]byte, size), 5)
	var k [KeyLen]byte
	replies := map[Protocol]string{
		Redis:     "$1024\r\n" + string(val) + "\r\n",
		Memcached: "VALUE " + string(Key(k[:], 5)) + " 0 1024\r\n" + string(val) + "\r\nEND\r\n",
	}
	for p, reply := range replies {
		rw := struct {
			io.Reader
			io.Writer
		}{&loop{b: []byte(reply)}, io.Discard}
		c, _ := NewConn(p, rw)
		w := &worker{conn: c, want: make([]byte, size), got: make([]byte, size)}
		if allocs := testing.AllocsPerRun(1000, func() {
			if err := w.get(5); err != nil {
				t.Fatal(err)
			}
		}); allocs != 0 {
			t.Errorf("%s: %v allocations per GET", p, allocs)
		}
		if w.res.Bad() != 0 {
			t.Errorf("%s: %s", p, w.res.FirstWrong)
		}
	}
}

func TestRedisReplies(t *testing.T) {
	for _, c := range []struct {
		reply string
		value string
		err   error
	}{
		{"$5\r\nhello\r\n", "hello", nil},
		{"$0\r\n\r\n", "", nil},
		{"$-1\r\n", "", ErrMiss},
		{"-ERR wrong\r\n", "", ServerError("ERR wrong")},
		{"$5\r\nhel", "", io.ErrUnexpectedEOF},
		{"", "", io.ErrUnexpectedEOF},
		{"$5\r\nhelloXX", "", ErrProtocol},
		{"$5\nhello\r\n", "", ErrProtocol},
		{":1\r\n", "", ErrProtocol},
		{"+OK\r\n", "", ErrProtocol},
		{"$17\r\n", "", ErrProtocol}, // longer than the 16 bytes expected
		{"$-2\r\n", "", ErrProtocol},
		{"$1x\r\n", "", ErrProtocol},
		{"$\r\n", "", ErrProtocol},
		{"\r\n", "", ErrProtocol},
		{"$" + strings.Repeat("9", 30) + "\r\n", "", ErrProtocol},
		{"$" + strings.Repeat("1", 5000) + "\r\n", "", ErrProtocol}, // a line longer than the buffer
	} {
		v, err := readRedisBulk(bufio.NewReaderSize(strings.NewReader(c.reply), 4096), make([]byte, 16))
		if !errors.Is(err, c.err) && err != c.err || string(v) != c.value {
			t.Errorf("%.20q: %q, %v; want %q, %v", c.reply, v, err, c.value, c.err)
		}
	}
	for _, c := range []struct {
		reply string
		err   error
	}{{"+OK\r\n", nil}, {"+QUEUED\r\n", ErrProtocol}, {"-OOM no\r\n", ServerError("OOM no")}, {"$2\r\nOK\r\n", ErrProtocol}} {
		if err := readRedisStatus(bufio.NewReader(strings.NewReader(c.reply)), "OK"); !errors.Is(err, c.err) && err != c.err {
			t.Errorf("%q: %v, want %v", c.reply, err, c.err)
		}
	}
}

func TestMemcacheReplies(t *testing.T) {
	for _, c := range []struct {
		reply string
		value string
		err   error
	}{
		{"VALUE k 0 5\r\nhello\r\nEND\r\n", "hello", nil},
		{"VALUE k 3 5 99\r\nhello\r\nEND\r\n", "hello", nil}, // flags, cas
		{"VALUE k 0 0\r\n\r\nEND\r\n", "", nil},
		{"END\r\n", "", ErrMiss},
		{"SERVER_ERROR out of memory\r\n", "", ServerError("SERVER_ERROR out of memory")},
		{"ERROR\r\n", "", ServerError("ERROR")},
		{"VALUE j 0 5\r\nhello\r\nEND\r\n", "", ErrProtocol}, // another key
		{"VALUE k 0 5\r\nhello\r\n", "", io.ErrUnexpectedEOF},
		{"VALUE k 0 5\r\nhello\r\nVALUE k 0 5\r\n", "", ErrProtocol},
		{"VALUE k 0 17\r\n", "", ErrProtocol},
		{"VALUE k 0 -1\r\n", "", ErrProtocol},
		{"VALUE k x 5\r\nhello\r\nEND\r\n", "", ErrProtocol},
		{"VALUE k 0\r\n", "", ErrProtocol},
		{"VALUE k 0 5 1 2\r\n", "", ErrProtocol},
		{"VALUE k  0 5\r\n", "", ErrProtocol},
		{"VALUE k 0 5\r\nhelloEND\r\n", "", ErrProtocol},
		{"STORED\r\n", "", ErrProtocol},
	} {
		v, err := readMemcacheValue(bufio.NewReader(strings.NewReader(c.reply)), []byte("k"), make([]byte, 16))
		if !errors.Is(err, c.err) && err != c.err || string(v) != c.value {
			t.Errorf("%q: %q, %v; want %q, %v", c.reply, v, err, c.value, c.err)
		}
	}
}
