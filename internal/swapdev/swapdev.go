package swapdev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNotSwap: the file has no loop device in use as swap.
var ErrNotSwap = errors.New("swapdev: not in use as swap")

// ErrNoDirectIO: the loop device did not get direct I/O (the kernel would
// swap in from the page cache and free nothing).
var ErrNoDirectIO = errors.New("swapdev: loop device without direct I/O")

// CommandError is a command that failed: its command line, combined output
// and error (an *exec.ExitError, or the error starting it).
type CommandError struct {
	Cmd    string
	Output string
	Err    error
}

func (e *CommandError) Error() string {
	out := strings.TrimSpace(e.Output)
	if out == "" {
		out = "(no output)"
	}
	return fmt.Sprintf("swapdev: `%s` failed: %v: %s", e.Cmd, e.Err, out)
}

func (e *CommandError) Unwrap() error { return e.Err }

func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), &CommandError{Cmd: name + " " + strings.Join(args, " "), Output: out.String(), Err: err}
	}
	return out.String(), nil
}

// Paths of the kernel's views; variables so tests can point them at files.
var (
	procSwaps = "/proc/swaps"
	sysBlock  = "/sys/block"
)

// Swap is one line of /proc/swaps.
type Swap struct {
	Device   string // e.g. /dev/loop3
	Type     string // partition or file
	Size     uint64 // KiB
	Used     uint64 // KiB
	Priority int
}

// ParseSwaps decodes the content of /proc/swaps.
func ParseSwaps(b []byte) ([]Swap, error) {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "Filename") {
		return nil, fmt.Errorf("swapdev: %s: no header line", procSwaps)
	}
	var out []Swap
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 5 {
			return nil, fmt.Errorf("swapdev: %s: bad line %q", procSwaps, l)
		}
		s := Swap{Device: UnescapePath(f[0]), Type: f[1]}
		var err error
		if s.Size, err = strconv.ParseUint(f[2], 10, 64); err == nil {
			if s.Used, err = strconv.ParseUint(f[3], 10, 64); err == nil {
				s.Priority, err = strconv.Atoi(f[4])
			}
		}
		if err != nil {
			return nil, fmt.Errorf("swapdev: %s: bad line %q: %w", procSwaps, l, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// UnescapePath undoes the octal escapes (\040 for a space) the kernel
// writes in paths of /proc/swaps and /proc/*/mountinfo.
func UnescapePath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Swaps returns the active swap areas.
func Swaps() ([]Swap, error) {
	b, err := os.ReadFile(procSwaps)
	if err != nil {
		return nil, fmt.Errorf("swapdev: %w", err)
	}
	return ParseSwaps(b)
}

// Active returns the active swap area on dev, if any.
func Active(dev string) (Swap, bool, error) {
	ss, err := Swaps()
	if err != nil {
		return Swap{}, false, err
	}
	for _, s := range ss {
		if s.Device == dev {
			return s, true, nil
		}
	}
	return Swap{}, false, nil
}

// Loop is an attached loop device.
type Loop struct {
	Device   string // /dev/loopN
	Backing  string // the backing file's path
	DirectIO bool
}

// Loops returns the attached loop devices.
func Loops() ([]Loop, error) {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("swapdev: %w", err)
	}
	var out []Loop
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		dir := filepath.Join(sysBlock, e.Name(), "loop")
		b, err := os.ReadFile(filepath.Join(dir, "backing_file"))
		if err != nil {
			continue // not attached (no loop/ directory) or detached meanwhile
		}
		dio, _ := os.ReadFile(filepath.Join(dir, "dio"))
		out = append(out, Loop{
			Device:   "/dev/" + e.Name(),
			Backing:  strings.TrimSuffix(string(b), "\n"),
			DirectIO: strings.TrimSpace(string(dio)) == "1",
		})
	}
	return out, nil
}

// LoopsOf returns the loop devices backed by file.
func LoopsOf(file string) ([]Loop, error) {
	path, err := filepath.Abs(file)
	if err != nil {
		return nil, fmt.Errorf("swapdev: %w", err)
	}
	all, err := Loops()
	if err != nil {
		return nil, err
	}
	var out []Loop
	for _, l := range all {
		if l.Backing == path {
			out = append(out, l)
		}
	}
	return out, nil
}

// InUse reports whether file backs a loop device, and whether one of them
// is active swap.
func InUse(file string) (loops []Loop, swap bool, err error) {
	if loops, err = LoopsOf(file); err != nil {
		return nil, false, err
	}
	for _, l := range loops {
		_, on, err := Active(l.Device)
		if err != nil {
			return nil, false, err
		}
		swap = swap || on
	}
	return loops, swap, nil
}

// On attaches file to a free loop device with direct I/O, runs mkswap on it
// and swapon with priority prio (-1: the kernel's default). It returns the
// loop device. On failure it undoes what it did.
func On(ctx context.Context, file string, prio int) (dev string, err error) {
	path, err := filepath.Abs(file)
	if err != nil {
		return "", fmt.Errorf("swapdev: %w", err)
	}
	if loops, swap, err := InUse(path); err != nil {
		return "", err
	} else if swap || len(loops) > 0 {
		return "", fmt.Errorf("swapdev: %s is already attached to %s", path, loops[0].Device)
	}
	out, err := run(ctx, "losetup", "--find", "--show", "--direct-io=on", path)
	if err != nil {
		return "", err
	}
	dev = strings.TrimSpace(out)
	defer func() {
		if err != nil {
			run(context.Background(), "swapoff", dev)
			run(context.Background(), "losetup", "--detach", dev)
		}
	}()
	loops, err := LoopsOf(path)
	if err != nil {
		return "", err
	}
	for _, l := range loops {
		if l.Device == dev && !l.DirectIO {
			return "", fmt.Errorf("%w: %s on %s (losetup said: %s)", ErrNoDirectIO, dev, path, strings.TrimSpace(out))
		}
	}
	if _, err = run(ctx, "mkswap", dev); err != nil {
		return "", err
	}
	args := []string{dev}
	if prio >= 0 {
		args = []string{"--priority", strconv.Itoa(prio), dev}
	}
	if _, err = run(ctx, "swapon", args...); err != nil {
		return "", err
	}
	return dev, nil
}

// Off turns off swap on every loop device backed by file and detaches
// them. It returns ErrNotSwap if there was none.
func Off(ctx context.Context, file string) error {
	loops, err := LoopsOf(file)
	if err != nil {
		return err
	}
	if len(loops) == 0 {
		return fmt.Errorf("%w: no loop device is backed by %s", ErrNotSwap, file)
	}
	for _, l := range loops {
		_, on, err := Active(l.Device)
		if err != nil {
			return err
		}
		if on {
			if _, err := run(ctx, "swapoff", l.Device); err != nil {
				return err
			}
		}
		if _, err := run(ctx, "losetup", "--detach", l.Device); err != nil {
			return err
		}
	}
	return nil
}
