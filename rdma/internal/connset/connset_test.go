package connset

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves a connection by reading until it ends.
type echo struct{ nc net.Conn }

func (e *echo) Serve()    { io.Copy(io.Discard, e.nc); e.nc.Close() }
func (e *echo) Shutdown() { e.nc.Close() }

func waitLen(t *testing.T, s *Set, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections served, want %d", s.Len(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBoundAndClose: past max, connections are closed at accept; a
// connection that ends leaves the set; Close shuts the rest down and waits
// for their goroutines (goleak checks), and may be called twice.
func TestBoundAndClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := Serve(ln, 2, func(nc net.Conn) (Conn, error) { return &echo{nc}, nil })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	defer a.Close()
	defer b.Close()
	waitLen(t, s, 2)
	extra := dial()
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("connection past the bound: read %v, want EOF (closed at accept)", err)
	}
	a.Close()
	waitLen(t, s, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if s.Len() != 0 {
		t.Fatalf("%d connections left after Close", s.Len())
	}
}

// TestOpenError: a connection open refuses is closed, and serving goes on.
func TestOpenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refuse := true
	s := Serve(ln, 0, func(nc net.Conn) (Conn, error) {
		if refuse {
			refuse = false
			return nil, errors.New("no")
		}
		return &echo{nc}, nil
	})
	defer s.Close()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c1.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c1.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("refused connection: read %v, want EOF", err)
	}
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitLen(t, s, 1)
}
