package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rmem/rdma"
	"rmem/rdma/internal/atomicmem"
)

// The test binary re-executes itself as a client process: a real second
// process that maps the server's memfd, as the memagent does.
const childEnv = "RMEM_SHM_TEST_CHILD"

func init() {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	os.Exit(childMain(spec))
}

// childMain: "mode path key". Modes:
//
//	write: write 0xEE pages with the key until it is revoked, then exit 0.
//	stall: map the key, mark itself inside an op (inflight=1), and hang.
func childMain(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 3 {
		return 2
	}
	k, err := rdma.ParseKey(f[2])
	if err != nil {
		return 3
	}
	c, err := Dial(context.Background(), f[1], rdma.DialOptions{})
	if err != nil {
		fmt.Println("dial:", err)
		return 4
	}
	defer c.Close()
	page := make([]byte, 4096)
	for i := range page {
		page[i] = 0xEE
	}
	ctx := context.Background()
	if err := rdma.Write(ctx, c, k, 0, page); err != nil {
		fmt.Println("first write:", err)
		return 5
	}
	switch f[0] {
	case "write":
		fmt.Println("ready")
		for i := uint64(0); ; i++ {
			err := rdma.Write(ctx, c, k, i%64*4096, page)
			if errors.Is(err, rdma.ErrRevokedKey) {
				return 0
			}
			if err != nil {
				fmt.Println("write:", err)
				return 6
			}
		}
	case "stall":
		sc := c.(*conn)
		sc.mu.Lock()
		atomicmem.Store32(sc.keys[k].busy, 1)
		fmt.Println("ready")
		select {}
	}
	return 7
}

func startChild(t *testing.T, mode, path string, k rdma.Key) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode+" "+path+" "+k.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not get ready: %q", sc.Text())
	}
	return cmd, sc
}

func serve(t *testing.T) (*rdma.Domain, *rdma.Region, string) {
	t.Helper()
	e := newEnv(t)
	return e.Domain, e.Region, e.Addr
}

// TestRevokeAcrossProcesses: a client process writes with a key as fast as
// it can; after Revoke returns the slab is zeroed and must stay zero.
func TestRevokeAcrossProcesses(t *testing.T) {
	d, r, path := serve(t)
	const base, size = 1 << 20, 256 << 10
	for round := range 3 {
		k, _ := d.IssueKey(r, base, size, rdma.AccessReadWrite)
		cmd, _ := startChild(t, "write", path, k)
		time.Sleep(5 * time.Millisecond) // let it write for a while
		if r.Bytes()[base] != 0xEE {
			t.Fatal("the child's writes are not in the region")
		}
		if err := d.Revoke(context.Background(), k); err != nil {
			t.Fatal(err)
		}
		slab := r.Bytes()[base : base+size]
		clear(slab)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("round %d: child: %v", round, err)
		}
		for i, b := range slab {
			if b != 0 {
				t.Fatalf("round %d: byte %d written after Revoke returned", round, i)
			}
		}
	}
}

// TestRevokeWaitsForStalledClientProcess: a client stopped inside an op
// stalls Revoke (which reports it) until the process dies.
func TestRevokeWaitsForStalledClientProcess(t *testing.T) {
	d, r, path := serve(t)
	k, _ := d.IssueKey(r, 0, 64<<10, rdma.AccessReadWrite)
	cmd, _ := startChild(t, "stall", path, k)
	defer cmd.Wait()
	defer cmd.Process.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := d.Revoke(ctx, k); !errors.Is(err, rdma.ErrRevokeIncomplete) {
		t.Fatalf("revoke with a client inside an op: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Revoke(context.Background(), k) }()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("revoke returned (%v) while the client was inside an op", err)
	default:
	}
	cmd.Process.Kill()
	if err := <-done; err != nil {
		t.Fatalf("revoke after the client died: %v", err)
	}
}

// TestFenceInProcess drives the slot words directly.
func TestFenceInProcess(t *testing.T) {
	d, r, path := serve(t)
	k, _ := d.IssueKey(r, 0, 4096, rdma.AccessReadWrite)
	c, err := Dial(context.Background(), path, rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := rdma.Write(context.Background(), c, k, 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	sc := c.(*conn)
	m := sc.keys[k]
	atomicmem.Store32(m.busy, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := d.Revoke(ctx, k); !errors.Is(err, rdma.ErrRevokeIncomplete) {
		t.Fatalf("revoke while busy: %v", err)
	}
	if st := atomicmem.Load32(m.state); st != slotRevoked {
		t.Fatalf("slot state %d after fence", st)
	}
	atomicmem.Store32(m.busy, 0)
	if err := d.Revoke(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	// The client drops the mapping and the server recycles the slot.
	if err := rdma.Write(context.Background(), c, k, 0, []byte("x")); !errors.Is(err, rdma.ErrRevokedKey) {
		t.Fatalf("write after revoke: %v", err)
	}
	if _, ok := sc.keys[k]; ok {
		t.Fatal("revoked mapping kept")
	}
	k2, _ := d.IssueKey(r, 0, 4096, rdma.AccessRead)
	if err := rdma.Read(context.Background(), c, k2, 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if slot := sc.keys[k2].slot; slot != m.slot {
		t.Logf("slot %d not recycled (got %d); UNMAP may still be in flight", m.slot, slot)
	}
}

func TestSocketPathErrors(t *testing.T) {
	d := rdma.NewDomain(rdma.DomainOptions{})
	if _, err := Listen(filepath.Join(t.TempDir(), "no", "such", "dir", "s.sock"), d, rdma.ListenOptions{}); err == nil {
		t.Fatal("listen in a missing directory succeeded")
	}
	if _, err := Dial(context.Background(), filepath.Join(t.TempDir(), "absent.sock"), rdma.DialOptions{}); !errors.Is(err, rdma.ErrTransport) {
		t.Fatalf("dial of a missing socket: %v", err)
	}
}
