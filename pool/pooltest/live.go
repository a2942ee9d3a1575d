package pooltest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/coord"
	"rmem/pool/httpapi"
	"rmem/pool/memserver"
	"rmem/pool/store"
	_ "rmem/rdma/tcp" // the memory servers' data plane
)

// Live is a real pool in the test's process: a coordinator (in-memory
// store) behind its HTTP API and memory servers m0, m1, ... with tcp data
// planes on loopback, registered with it. For the tests of the pool's
// users (pager/poolstore, internal/swapd); everything stops at the test's
// end.
type Live struct {
	Client  *client.Client                      // the coordinator's client
	Servers map[pool.ServerID]*memserver.Server // by id, to close one (a failure)
}

// StartLive starts a Live pool of servers memory servers of 4 slabs of
// slabSize bytes each. It skips the test when the machine has no memory
// for a memory server.
func StartLive(t testing.TB, servers int, slabSize uint64) *Live {
	t.Helper()
	l := &Live{Servers: map[pool.ServerID]*memserver.Server{}}
	c, err := coord.New(coord.Options{Store: store.NewMem(), Dialer: liveDialer(l.Servers), SlabSize: slabSize})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	if err := c.Routes(mux); err != nil {
		t.Fatal(err)
	}
	mux.HandleFunc("/", httpapi.NotFound)
	srv := httptest.NewServer(mux)
	if l.Client, err = client.New(srv.URL, client.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Client.CloseIdleConnections()
		srv.Close()
		c.Close()
	})
	for i := range servers {
		id := pool.ServerID(fmt.Sprintf("m%d", i))
		ms, err := memserver.New(memserver.Options{ID: id, Capacity: 4 * slabSize, SlabSize: slabSize, NoLock: true, NoHugeTLB: true,
			Listen: map[string]string{"tcp": "127.0.0.1:0"}})
		if err != nil {
			if errors.Is(err, memserver.ErrMemory) {
				t.Skipf("no memory for a memory server: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		l.Servers[id] = ms
		if _, err := l.Client.Register(context.Background(), ms.Info()); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// liveDialer reaches a Live pool's memory servers in process.
type liveDialer map[pool.ServerID]*memserver.Server

func (d liveDialer) SlabServer(info *pool.ServerInfo) (coord.SlabServer, error) {
	if s := d[info.ID]; s != nil {
		return s, nil
	}
	return nil, errors.New("pooltest: no such server")
}
