// Package harness is what the benchmark commands (bench, bench/services)
// share to compare rmem with the kernel's own swap: swap to zram, a memd
// of the benchmark's own, a command run under a deadline, and the CPU
// time of a process read from procfs.
//
// It is not for tests: it needs root and changes the host's swap.
package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// ZramOn makes sure swap to zram is on: it sets up /dev/zram0 (2 GiB, lz4)
// when it is free, and returns what undoes that (nil when zram swap was
// already on).
func ZramOn() (undo func(), err error) {
	if b, _ := os.ReadFile("/proc/swaps"); strings.Contains(string(b), "/dev/zram") {
		return nil, nil
	}
	if _, err := os.Stat("/sys/block/zram0"); err != nil {
		exec.Command("modprobe", "zram").Run()
	}
	ds, err := os.ReadFile("/sys/block/zram0/disksize")
	if err != nil {
		return nil, fmt.Errorf("no zram device: %w", err)
	}
	if strings.TrimSpace(string(ds)) != "0" {
		return nil, errors.New("/dev/zram0 is in use and not swap")
	}
	os.WriteFile("/sys/block/zram0/comp_algorithm", []byte("lz4"), 0) // default otherwise
	if err := os.WriteFile("/sys/block/zram0/disksize", []byte("2G"), 0); err != nil {
		return nil, fmt.Errorf("zram disksize: %w", err)
	}
	reset := func() { os.WriteFile("/sys/block/zram0/reset", []byte("1"), 0) }
	for _, c := range [][]string{{"mkswap", "/dev/zram0"}, {"swapon", "/dev/zram0"}} {
		if b, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			reset()
			return nil, fmt.Errorf("%s: %v: %s", c[0], err, b)
		}
	}
	return func() { exec.Command("swapoff", "/dev/zram0").Run(); reset() }, nil
}

// OutputCtx runs cmd and returns its standard output; it kills cmd when
// ctx ends first, and then says it timed out.
func OutputCtx(ctx context.Context, cmd *exec.Cmd) (string, error) {
	var b strings.Builder
	cmd.Stdout = &b
	if err := cmd.Start(); err != nil {
		return "", err
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	defer stop()
	err := cmd.Wait()
	if ctx.Err() != nil {
		return b.String(), fmt.Errorf("timed out")
	}
	return b.String(), err
}

// ProcCPU returns the CPU time (user + system, the process's own threads,
// not its children's) of process pid so far, in seconds, in clock ticks of
// 10 ms.
func ProcCPU(pid int) (float64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return st.CPUTime(), nil
}

// Memd is the pool of a benchmark: one memd on this host, with its
// coordinator, its store and its runtime files in a directory of the
// benchmark's own.
type Memd struct {
	cmd       *exec.Cmd
	URL       string // the coordinator's control API
	TokenFile string // its token
	Dir       string // the benchmark's directory it was started in
}

// StartMemd starts bin/memd serving 2 GiB in 64 MiB slabs, its control API
// on 127.0.0.1:port and its tcp data plane on port+1, and waits until it
// answers.
func StartMemd(bin, dir string, port int) (*Memd, error) {
	m := &Memd{URL: fmt.Sprintf("http://127.0.0.1:%d", port), Dir: dir, TokenFile: filepath.Join(dir, "run", "token")}
	m.cmd = exec.Command(filepath.Join(bin, "memd"), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--tcp-listen", fmt.Sprintf("127.0.0.1:%d", port+1),
		"--runtime-dir", filepath.Join(dir, "run"), "--data-dir", filepath.Join(dir, "data"), "--capacity", "2GiB",
		"--slab-size", "64MiB", "--log-format", "json")
	logf, err := os.Create(filepath.Join(dir, "memd.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("memd: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(m.TokenFile); err == nil {
			if exec.Command(filepath.Join(bin, "memd"), "status", "--coordinator", m.URL, "--token-file", m.TokenFile).Run() == nil {
				return m, nil
			}
		}
		if time.Now().After(deadline) {
			m.Stop()
			return nil, errors.New("memd did not start (see its log)")
		}
	}
}

// CPU returns memd's CPU time so far, in seconds.
func (m *Memd) CPU() (float64, error) { return ProcCPU(m.cmd.Process.Pid) }

// Stop stops memd and waits for it.
func (m *Memd) Stop() {
	m.cmd.Process.Signal(syscall.SIGTERM)
	m.cmd.Wait()
}
