//go:build verbs

package verbs_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rmem/pager/remote"
	"rmem/pager/slabio"
	"rmem/rdma"
)

// TestSlabioRegisterLocal: the pager's page I/O (pager/slabio) over verbs
// with its buffers registered (IO.RegisterLocal): an mmap'd one before the
// first dial and a Go one after it both reach the connection, and pages
// written from one and read into the other carry the right data.
func TestSlabioRegisterLocal(t *testing.T) {
	e := newEnv(t)
	const slab = 1 << 20
	const pages = 32
	k, err := e.Domain.IssueKey(e.Region, 0, slab, rdma.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	tab := slabio.NewTable(slab, rdma.DialOptions{Depth: 16})
	tab.Put(1, []slabio.Replica{{Server: "vm", Network: "verbs", Addr: e.Addr, Key: k}})
	staging, err := unix.Mmap(-1, 0, pages*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(staging)
	io := tab.NewIO()
	defer io.Close() // before the munmap: it deregisters the staging memory
	if err := io.RegisterLocal(staging); err != nil {
		t.Fatal(err)
	}
	for i := range staging {
		staging[i] = byte(i*31 + i>>12)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ops := make([]remote.PageOp, pages)
	for p := range ops {
		ops[p] = remote.PageOp{Slab: 1, Off: uint64(p) * 4096 * 5 % slab, Buf: staging[p*4096 : (p+1)*4096]}
	}
	if err := io.Write(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatalf("write at %d: %v", op.Off, op.Err)
		}
		if !bytes.Equal(e.Region.Bytes()[op.Off:op.Off+4096], op.Buf) {
			t.Fatalf("write at %d: the region differs", op.Off)
		}
	}
	bufs := make([]byte, pages*4096)
	if err := io.RegisterLocal(bufs); err != nil {
		t.Fatal(err)
	}
	for p := range ops {
		ops[p].Buf = bufs[p*4096 : (p+1)*4096]
	}
	if err := io.Read(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Err != nil {
			t.Fatalf("read at %d: %v", op.Off, op.Err)
		}
	}
	if !bytes.Equal(bufs, staging) {
		t.Fatal("pages read back differ from those written")
	}
	if st := tab.Stats(); st.LocalRegistered != 2 || st.LocalRefused != 0 {
		t.Fatalf("registrations: %d taken, %d refused; want 2, 0", st.LocalRegistered, st.LocalRefused)
	}
}
