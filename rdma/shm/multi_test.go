package shm_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"rmem/rdma"
	_ "rmem/rdma/shm"
	_ "rmem/rdma/tcp"
)

// TestOneDomainTwoProviders serves one region and key table over tcp and
// shm at once, as memd does: data written through one is read through the
// other, and a revocation applies to both.
func TestOneDomainTwoProviders(t *testing.T) {
	ctx := context.Background()
	d := rdma.NewDomain(rdma.DomainOptions{})
	r, err := rdma.AllocRegion(4<<20, rdma.RegionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := d.Register(r); err != nil {
		t.Fatal(err)
	}
	defer d.Deregister(ctx, r)
	tl, err := rdma.Listen("tcp", "127.0.0.1:0", d, rdma.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	sl, err := rdma.Listen("shm", filepath.Join(t.TempDir(), "s.sock"), d, rdma.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	tc, err := rdma.Dial(ctx, "tcp", tl.Addr(), rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	sc, err := rdma.Dial(ctx, "shm", sl.Addr(), rdma.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()

	k, _ := d.IssueKey(r, 64<<20>>6, 1<<20, rdma.AccessReadWrite)
	if err := rdma.Write(ctx, tc, k, 100, []byte("via tcp")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 7)
	if err := rdma.Read(ctx, sc, k, 100, got); err != nil || string(got) != "via tcp" {
		t.Fatalf("shm read of a tcp write: %q %v", got, err)
	}
	if _, err := rdma.FetchAdd(ctx, sc, k, 8, 5); err != nil {
		t.Fatal(err)
	}
	if old, err := rdma.FetchAdd(ctx, tc, k, 8, 1); err != nil || old != 5 {
		t.Fatalf("tcp fetch-add after shm fetch-add: %d %v", old, err)
	}
	if err := d.Revoke(ctx, k); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]rdma.Conn{"tcp": tc, "shm": sc} {
		if err := rdma.Read(ctx, c, k, 0, got); !errors.Is(err, rdma.ErrRevokedKey) {
			t.Errorf("%s read after revoke: %v", name, err)
		}
	}
}
