// Package livetop runs a live terminal view, as top and iostat 1 do: a
// screen fetched every interval and drawn on the terminal's alternate
// screen, with one-key commands read in raw mode, q to quit. memagent top
// and memd top are its screens. It draws with plain ANSI sequences and
// golang.org/x/term; it is not a widget toolkit, and what a frame says is
// the screen's business (a plain function of what it fetched).
package livetop

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"rmem/internal/cli"
)

// Screen is what a live view shows.
type Screen interface {
	// Fetch takes a new snapshot (at now).
	Fetch(ctx context.Context) error
	// Draw writes a frame within width x height (0: no limit), its
	// lines ended by eol.
	Draw(w io.Writer, width, height int, eol string) error
	// Key handles a key other than q, reporting whether the frame
	// changed (drawn again at once).
	Key(k byte) bool
}

// Flags declares a view's --interval and --once.
func Flags(f *pflag.FlagSet) {
	f.String("interval", "1s", "time between frames")
	f.Bool("once", false, "print one frame (rates over one interval) and exit")
}

// Main shows s as Flags ask: one frame on app's stdout with --once (after
// an interval when rates, so that they cover one), else live on the
// terminal until q.
func Main(ctx context.Context, app *cli.App, s Screen, rates bool) error {
	interval, err := app.Duration("interval")
	if err != nil {
		return err
	}
	if interval < 100*time.Millisecond {
		return app.Invalid("interval", "must be at least 100ms")
	}
	once, err := app.Bool("once")
	if err != nil {
		return err
	}
	if once {
		if !rates {
			interval = 0
		}
		return Once(ctx, s, interval, app.Stdout())
	}
	return Run(ctx, s, interval, os.Stdin, os.Stdout)
}

// Once fetches, waits interval, fetches again (so that rates cover an
// interval) and draws one frame on out, for scripts and logs.
func Once(ctx context.Context, s Screen, interval time.Duration, out io.Writer) error {
	if err := s.Fetch(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(interval):
	}
	if err := s.Fetch(ctx); err != nil {
		return err
	}
	return s.Draw(out, 0, 0, "\n")
}

// Run shows s on out until q (or ^C, ^D, the end of ctx), fetching every
// interval; keys come from in when it is a terminal (in raw mode
// meanwhile). On a terminal the frame fits its size (80x24 if unknown).
func Run(ctx context.Context, s Screen, interval time.Duration, in, out *os.File) error {
	if err := s.Fetch(ctx); err != nil {
		return err
	}
	width, height := 80, 24
	tty := term.IsTerminal(int(out.Fd()))
	if tty {
		fmt.Fprint(out, "\x1b[?1049h\x1b[?25l") // the alternate screen, no cursor
		defer fmt.Fprint(out, "\x1b[?25h\x1b[?1049l")
	}
	keys := -1
	if term.IsTerminal(int(in.Fd())) {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(in.Fd()), old)
		keys = int(in.Fd())
	}
	draw := func() error {
		if tty {
			if w, h, err := term.GetSize(int(out.Fd())); err == nil {
				width, height = w, h
			}
			fmt.Fprint(out, "\x1b[H\x1b[2J")
		}
		return s.Draw(out, width, height, "\r\n")
	}
	if err := draw(); err != nil {
		return err
	}
	next := time.Now().Add(interval)
	for {
		k, err := waitKey(ctx, keys, time.Until(next))
		if err != nil {
			return err
		}
		switch {
		case k == 'q' || k == 'Q' || k == 3 || k == 4: // q, ^C, ^D
			return nil
		case k != 0:
			if s.Key(k) {
				if err := draw(); err != nil {
					return err
				}
			}
			continue
		case time.Now().Before(next):
			continue
		}
		if err := s.Fetch(ctx); err != nil {
			return err
		}
		next = time.Now().Add(interval)
		if err := draw(); err != nil {
			return err
		}
	}
}

// waitKey waits up to d for a key on fd (-1: none, only the wait) and
// returns it, or 0 when d passed first.
func waitKey(ctx context.Context, fd int, d time.Duration) (byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, nil
	}
	if fd < 0 {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(d):
			return 0, nil
		}
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds())+1)
	if err == unix.EINTR || n == 0 {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var b [1]byte
	if m, err := unix.Read(fd, b[:]); err != nil || m == 0 {
		return 'q', nil // the terminal went away
	}
	return b[0], nil
}

// Fit cuts lines to height and each to width columns (runes; 0: no
// limit) and writes them ended by eol (the last one too only when eol is
// a newline: a terminal would scroll).
func Fit(w io.Writer, lines []string, width, height int, eol string) error {
	if height > 0 && len(lines) > height {
		lines = lines[:height]
	}
	var b strings.Builder
	for i, l := range lines {
		if r := []rune(l); width > 0 && len(r) > width {
			l = string(r[:width])
		}
		b.WriteString(l)
		if i < len(lines)-1 || eol == "\n" {
			b.WriteString(eol)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Narrow columns: figures in a few characters.

// Bytes is n in at most 5 columns: 512B, 64K, 12.5M, 1.2G.
func Bytes(n uint64) string {
	v, unit := float64(n), ""
	for _, u := range []string{"K", "M", "G", "T"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	switch {
	case unit == "":
		return strconv.FormatUint(n, 10) + "B"
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64) + unit
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + unit
}

// Rate is a rate per second in at most 6 columns: 12, 1.2k, 123.4k, 1.2M.
func Rate(r float64) string {
	switch {
	case r < 1000:
		return strconv.FormatFloat(r, 'f', 0, 64)
	case r < 1e6:
		return strconv.FormatFloat(r/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(r/1e6, 'f', 1, 64) + "M"
}

// Count is a count in at most 4 columns: 12, 999, 1.2k, 12k, 1.2M.
func Count(n uint64) string {
	switch {
	case n < 1000:
		return strconv.FormatUint(n, 10)
	case n < 10000:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + "k"
	case n < 1e6:
		return strconv.FormatUint(n/1000, 10) + "k"
	case n < 1e7:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	}
	return strconv.FormatUint(n/1e6, 10) + "M"
}

// Dur is d in at most 5 columns: 850n, 12µs, 1.2ms, 12ms, 1.2s.
func Dur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "n"
	case d < 10*time.Microsecond:
		return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) + "µs"
	case d < time.Millisecond:
		return strconv.FormatInt(int64(d/time.Microsecond), 10) + "µs"
	case d < 10*time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms"
	case d < time.Second:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
}
