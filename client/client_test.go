package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"rmem/client"
	"rmem/pager"
	"rmem/pager/pagertest"
	"rmem/userfaultfd"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConnectNoAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for userfaultfd")
	}
	_, err := client.Connect(filepath.Join(t.TempDir(), "nothing.sock"))
	if err == nil {
		t.Fatal("connected to nothing")
	}
}

// Map and Unmap against a real agent. The test never touches the mapped
// memory: its faults would be served by this very process (the agent runs
// here), which is what DESIGN.md pitfall 1 forbids. Paging itself is
// tested in package pager with a child process.
func TestMapUnmap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent serves this process's userfaultfd")
	}
	if _, _, err := userfaultfd.Probe(); err != nil {
		t.Skipf("no userfaultfd: %v", err)
	}
	store := pagertest.New(t, pagertest.Options{})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	a, err := pager.New(pager.Options{Socket: sock, Store: store, LocalMem: 1 << 20, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	defer func() {
		a.Close()
		<-done
	}()
	c, err := client.Connect(sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Map(0); err == nil {
		t.Fatal("Map(0) worked")
	}
	b1, err := c.Map(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := c.Map(5000) // rounded up to two pages inside
	if err != nil {
		t.Fatal(err)
	}
	if len(b1) != 3<<20 || len(b2) != 5000 {
		t.Fatalf("lengths %d %d", len(b1), len(b2))
	}
	st := a.Stats()
	if len(st) != 1 || st[0].Regions != 2 || st[0].PID != os.Getpid() {
		t.Fatalf("agent sees %+v", st)
	}
	if err := c.Unmap(b1); err != nil {
		t.Fatal(err)
	}
	if err := c.Unmap(b1); !errors.Is(err, client.ErrNotMapped) {
		t.Fatalf("second Unmap: %v", err)
	}
	if err := c.Unmap(make([]byte, 10)); !errors.Is(err, client.ErrNotMapped) {
		t.Fatalf("Unmap of heap memory: %v", err)
	}
	if st := a.Stats(); st[0].Regions != 1 {
		t.Fatalf("after Unmap: %+v", st)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Map(4096); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Map after Close: %v", err)
	}
}
