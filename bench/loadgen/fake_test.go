package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

// fakeServer is a key-value server of either protocol over net.Pipe
// connections, just enough for the load generator. Alter, when set,
// rewrites a value it is about to return (nil: the key is missing).
type fakeServer struct {
	proto Protocol
	Alter func(key string, v []byte) []byte

	mu   sync.Mutex
	data map[string][]byte
	wg   sync.WaitGroup
}

func newFake(p Protocol) *fakeServer { return &fakeServer{proto: p, data: map[string][]byte{}} }

// Dial returns the client end of a new connection the server serves.
func (s *fakeServer) Dial(context.Context) (net.Conn, error) {
	c, srv := net.Pipe()
	s.wg.Go(func() {
		defer srv.Close()
		r, w := bufio.NewReader(srv), bufio.NewWriter(srv)
		for {
			var err error
			if s.proto == Redis {
				err = s.serveRedis(r, w)
			} else {
				err = s.serveMemcache(r, w)
			}
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				return
			}
		}
	})
	return c, nil
}

// Wait waits for the connections' goroutines (after the client closed them).
func (s *fakeServer) Wait() { s.wg.Wait() }

func (s *fakeServer) set(k string, v []byte) {
	s.mu.Lock()
	s.data[k] = v
	s.mu.Unlock()
}

func (s *fakeServer) get(k string) []byte {
	s.mu.Lock()
	v, ok := s.data[k]
	s.mu.Unlock()
	if ok && s.Alter != nil {
		v = s.Alter(k, append([]byte(nil), v...))
	}
	return v
}

func (s *fakeServer) serveRedis(r *bufio.Reader, w *bufio.Writer) error {
	var args []string
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
	for range n {
		if line, err = r.ReadString('\n'); err != nil {
			return err
		}
		l, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		args = append(args, string(b[:l]))
	}
	switch {
	case len(args) == 3 && args[0] == "SET":
		s.set(args[1], []byte(args[2]))
		w.WriteString("+OK\r\n")
	case len(args) == 2 && args[0] == "GET":
		if v := s.get(args[1]); v != nil {
			fmt.Fprintf(w, "$%d\r\n%s\r\n", len(v), v)
		} else {
			w.WriteString("$-1\r\n")
		}
	default:
		fmt.Fprintf(w, "-ERR unknown command %q\r\n", args)
	}
	return nil
}

func (s *fakeServer) serveMemcache(r *bufio.Reader, w *bufio.Writer) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	switch {
	case len(f) == 5 && f[0] == "set":
		l, _ := strconv.Atoi(f[4])
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		s.set(f[1], b[:l])
		w.WriteString("STORED\r\n")
	case len(f) == 2 && f[0] == "get":
		if v := s.get(f[1]); v != nil {
			fmt.Fprintf(w, "VALUE %s 0 %d\r\n%s\r\n", f[1], len(v), v)
		}
		w.WriteString("END\r\n")
	default:
		w.WriteString("ERROR\r\n")
	}
	return nil
}
