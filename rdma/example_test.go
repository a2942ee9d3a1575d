package rdma_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"rmem/rdma"
)

// A memory server and a pager in a few lines: the server registers a memfd
// region and issues a key for one slab; the client dials, writes a page and
// reads it back with a batch, then the server revokes the key.
func Example() {
	ctx := context.Background()

	// Memory server (memd).
	region, _ := rdma.AllocRegion(4<<20, rdma.RegionOptions{Name: "example"})
	defer region.Close()
	d := rdma.NewDomain(rdma.DomainOptions{})
	d.Register(region)
	defer d.Deregister(ctx, region)
	tl, _ := rdma.Listen("tcp", "127.0.0.1:0", d, rdma.ListenOptions{})
	defer tl.Close()
	dir, _ := os.MkdirTemp("", "rdma-example")
	defer os.RemoveAll(dir)
	sl, _ := rdma.Listen("shm", filepath.Join(dir, "memd.sock"), d, rdma.ListenOptions{})
	defer sl.Close()
	slab, _ := d.IssueKey(region, 1<<20, 1<<20, rdma.AccessReadWrite) // a "slab"

	// Pager (memagent): one connection per fault thread.
	for _, p := range []struct{ network, addr string }{{"tcp", tl.Addr()}, {"shm", sl.Addr()}} {
		c, err := rdma.Dial(ctx, p.network, p.addr, rdma.DialOptions{Depth: 64})
		if err != nil {
			fmt.Println(err)
			return
		}
		page := make([]byte, 4096)
		copy(page, "hello from "+p.network)
		wrs := []rdma.WorkRequest{
			{ID: 1, Op: rdma.OpWrite, Key: slab, Offset: 8192, Local: page},
			{ID: 2, Op: rdma.OpRead, Key: slab, Offset: 8192, Local: make([]byte, 4096)},
		}
		if err := c.Post(wrs); err != nil {
			fmt.Println(err)
			return
		}
		cqes := make([]rdma.Completion, 2)
		for got := 0; got < 2; {
			n, err := c.Wait(ctx, cqes[got:])
			if err != nil {
				fmt.Println(err)
				return
			}
			got += n
		}
		fmt.Println(cqes[0].ID, cqes[0].Status, cqes[1].ID, cqes[1].Status, string(wrs[1].Local[:14]))
		c.Close()
	}

	// The slab is freed: revoke, then zero it for the next tenant.
	if err := d.Revoke(ctx, slab); err != nil {
		fmt.Println(err)
	}
	clear(region.Bytes()[1<<20 : 2<<20])
	// Output:
	// 1 OK 2 OK hello from tcp
	// 1 OK 2 OK hello from shm
}
