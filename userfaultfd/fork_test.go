package userfaultfd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// buildC compiles testdata/NAME.c with gcc, skipping the test without gcc.
func buildC(t *testing.T, name string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: the fork test forks from C")
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command(gcc, "-O1", "-Wall", "-o", bin, "testdata/"+name+".c").CombinedOutput(); err != nil {
		t.Fatalf("gcc %s.c: %v\n%s", name, err, out)
	}
	return bin
}

// TestForkEvent serves a C process that forks: the FORK event delivers the
// child's uffd, through which the test serves the child's faults (with a
// different generation), while the parent's faults keep coming through the
// original uffd, and the child's writes stay private.
func TestForkEvent(t *testing.T) {
	skipUnlessFeatures(t, FeatureEventFork)
	bin := buildC(t, "forker")
	const pages = 64
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, sock, fmt.Sprint(pages))
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ln.SetDeadline(time.Now().Add(30 * time.Second))
	conn, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, helloSize)
	fds := make([]int, 1)
	if _, nfds, err := RecvFDs(conn, buf, fds); err != nil || nfds != 1 {
		t.Fatalf("hello: %v (%d fds); stderr: %s", err, nfds, &stderr)
	}
	h := decodeHello(buf)
	base := Addr(h.Addr)
	parent, err := FromFD(fds[0], Feature(h.Features))
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	var children []*UFFD
	faults := map[int]int{} // generation → faults served
	var serveUFFD func(u *UFFD, gen uint64)
	serveUFFD = func(u *UFFD, gen uint64) {
		defer wg.Done()
		p, err := NewPoller(u)
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			return
		}
		defer p.Close()
		src := make([]byte, ps)
		err = p.Run(ctx, make([]Msg, 8), func(batch []Msg) error {
			for i := range batch {
				ev, err := batch[i].Decode()
				if err != nil {
					return err
				}
				switch ev.Kind {
				case EventPagefault:
					idx := uint64(ev.Addr-base) / PageSize
					fillPattern(src, idx, gen)
					if _, err := u.Copy(ev.Addr, src, 0); err != nil && !IsExist(err) {
						return err
					}
					mu.Lock()
					faults[int(gen)]++
					mu.Unlock()
				case EventFork:
					child, err := FromFD(ev.FD, u.Features())
					if err != nil {
						return err
					}
					mu.Lock()
					children = append(children, child)
					mu.Unlock()
					wg.Add(1)
					go serveUFFD(child, gen+1)
				default:
					return fmt.Errorf("unexpected %v event", ev.Kind)
				}
			}
			return nil
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	wg.Add(1)
	go serveUFFD(parent, 0)

	if _, err := conn.Write([]byte{'g'}); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, 2)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, rerr := io.ReadFull(conn, status)
	cancel()
	wg.Wait()
	for _, c := range children {
		c.Close()
	}
	for _, err := range errs {
		t.Error(err)
	}
	if rerr != nil {
		t.Fatalf("status: %v; stderr: %s", rerr, &stderr)
	}
	if status[0] != '0' || status[1] != '0' {
		t.Fatalf("forker: child status %c, parent mismatch %c; stderr: %s", status[0], status[1], &stderr)
	}
	// Parent: first half before fork, second half after; child: second half.
	if faults[0] != pages || faults[1] != pages/2 {
		t.Errorf("faults served: %v, want gen0 %d, gen1 %d", faults, pages, pages/2)
	}
}
