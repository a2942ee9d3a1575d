package livetop

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFit(t *testing.T) {
	var b bytes.Buffer
	Fit(&b, []string{"µµµµµ", "abcdef", "gone"}, 3, 2, "\r\n")
	if got := b.String(); got != "µµµ\r\nabc" {
		t.Fatalf("Fit at 3x2: %q", got)
	}
	b.Reset()
	Fit(&b, []string{"a", "b"}, 0, 0, "\n")
	if got := b.String(); got != "a\nb\n" {
		t.Fatalf("Fit unbounded: %q", got)
	}
}

// counter counts its fetches and keys.
type counter struct {
	fetches int
	keys    []byte
}

func (c *counter) Fetch(context.Context) error { c.fetches++; return nil }
func (c *counter) Draw(w io.Writer, width, height int, eol string) error {
	_, err := fmt.Fprintf(w, "frame %d %dx%d%s", c.fetches, width, height, eol)
	return err
}
func (c *counter) Key(k byte) bool { c.keys = append(c.keys, k); return k == 'x' }

func TestOnce(t *testing.T) {
	var c counter
	var b bytes.Buffer
	if err := Once(context.Background(), &c, 10*time.Millisecond, &b); err != nil {
		t.Fatal(err)
	}
	if b.String() != "frame 2 0x0\n" {
		t.Fatalf("Once drew %q: want one frame after two fetches, unbounded", b.String())
	}
}

// Run reads keys from in (a pipe here, not a terminal: no keys are read,
// the view runs until ctx ends) and draws every interval on out.
func TestRunUntilCtx(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var c counter
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := Run(ctx, &c, 50*time.Millisecond, r, out); err != context.DeadlineExceeded {
		t.Fatalf("Run: %v, want the end of ctx", err)
	}
	b, _ := os.ReadFile(out.Name())
	if c.fetches < 2 || !strings.HasPrefix(string(b), "frame 1 80x24\r\n") || strings.Contains(string(b), "\x1b") {
		t.Fatalf("%d fetches, drew %q: want frames every interval, 80x24, no escapes off a terminal", c.fetches, b)
	}
}

func TestWaitKey(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if k, err := waitKey(context.Background(), int(r.Fd()), 20*time.Millisecond); k != 0 || err != nil {
		t.Fatalf("no key: %q %v", k, err)
	}
	w.Write([]byte("m"))
	if k, err := waitKey(context.Background(), int(r.Fd()), time.Minute); k != 'm' || err != nil {
		t.Fatalf("a key: %q %v", k, err)
	}
	w.Close()
	if k, _ := waitKey(context.Background(), int(r.Fd()), time.Minute); k != 'q' {
		t.Fatalf("the terminal gone: %q, want q", k)
	}
}

func TestFigures(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Bytes(512), "512B"}, {Bytes(64 << 10), "64.0K"}, {Bytes(200 << 20), "200M"}, {Bytes(1 << 30), "1.0G"},
		{Rate(12), "12"}, {Rate(1234), "1.2k"}, {Rate(123456), "123.5k"}, {Rate(1.5e6), "1.5M"},
		{Count(999), "999"}, {Count(1200), "1.2k"}, {Count(12345), "12k"}, {Count(2500000), "2.5M"},
		{Dur(0), "-"}, {Dur(850), "850n"}, {Dur(8700), "8.7µs"}, {Dur(120 * time.Microsecond), "120µs"},
		{Dur(1200 * time.Microsecond), "1.2ms"}, {Dur(1500 * time.Millisecond), "1.5s"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
