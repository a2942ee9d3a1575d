//go:build verbs

package verbs_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/rdma"
	"rmem/rdma/verbs"
)

// TestRegisterLocal: READs and WRITEs whose Local buffers are registered
// (an mmap'd pool and a Go slice) move directly, with the right data, no
// allocation, and the registration rules hold.
func TestRegisterLocal(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := rdma.Dial(ctx, "verbs", e.Addr, rdma.DialOptions{Depth: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lr, ok := c.(verbs.LocalRegistrar)
	if !ok {
		t.Fatal("a verbs Conn does not implement LocalRegistrar")
	}
	pool, err := unix.Mmap(-1, 0, 16*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(pool)
	goBuf := make([]byte, 8*4096)
	if err := lr.RegisterLocal(pool); err != nil {
		t.Fatal(err)
	}
	if err := lr.RegisterLocal(goBuf); err != nil {
		t.Fatal(err)
	}
	if err := lr.RegisterLocal(pool[4096:8192]); !errors.Is(err, verbs.ErrLocalOverlap) {
		t.Fatalf("overlapping registration: %v", err)
	}
	k, err := e.Domain.IssueKey(e.Region, 0, 1<<20, rdma.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pool {
		pool[i] = byte(i * 13)
	}
	wrs := make([]rdma.WorkRequest, 16)
	for i := range wrs {
		wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpWrite, Key: k, Offset: uint64(i) * 4096, Local: pool[i*4096 : (i+1)*4096]}
	}
	waitBatch(t, c, wrs)
	if !bytes.Equal(e.Region.Bytes()[:len(pool)], pool) {
		t.Fatal("direct WRITEs: region differs")
	}
	// READ into the Go buffer (direct) and into an unregistered one
	// (bounce), in one batch, from the same pages.
	plain := make([]byte, 8*4096)
	for i := range 8 {
		wrs[i] = rdma.WorkRequest{ID: uint64(i), Op: rdma.OpRead, Key: k, Offset: uint64(i) * 4096, Local: goBuf[i*4096 : (i+1)*4096]}
		wrs[8+i] = rdma.WorkRequest{ID: uint64(8 + i), Op: rdma.OpRead, Key: k, Offset: uint64(i) * 4096, Local: plain[i*4096 : (i+1)*4096]}
	}
	waitBatch(t, c, wrs)
	if !bytes.Equal(goBuf, pool[:len(goBuf)]) || !bytes.Equal(plain, pool[:len(plain)]) {
		t.Fatal("READs: data differs")
	}
	cq := make([]rdma.Completion, 16)
	allocs := testing.AllocsPerRun(50, func() {
		if err := c.Post(wrs[:8]); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 8; {
			n, err := c.Wait(ctx, cq)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	})
	if allocs != 0 {
		t.Errorf("direct READs: %.1f allocations per batch, want 0", allocs)
	}
	// Busy while a request uses it, free once its completion is returned.
	if err := c.Post(wrs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := lr.DeregisterLocal(goBuf); err != nil && !errors.Is(err, verbs.ErrLocalBusy) {
		t.Fatalf("deregister with a request outstanding: %v", err)
	} else if err == nil {
		t.Log("the READ completed before DeregisterLocal looked")
		if err := lr.RegisterLocal(goBuf); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Wait(ctx, cq); err != nil {
		t.Fatal(err)
	}
	if err := lr.DeregisterLocal(goBuf); err != nil {
		t.Fatal(err)
	}
	if err := lr.DeregisterLocal(goBuf); !errors.Is(err, verbs.ErrLocalNotFound) {
		t.Fatalf("second deregister: %v", err)
	}
	// After deregistration the buffer goes through the bounce arena again.
	clear(goBuf)
	waitBatch(t, c, wrs[:8])
	if !bytes.Equal(goBuf, pool[:len(goBuf)]) {
		t.Fatal("READs after deregistration: data differs")
	}
}
