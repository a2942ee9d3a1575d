package coord_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"rmem/pool"
	"rmem/pool/coord"
	"rmem/pool/store"
)

// Concurrent agents allocate, renew, replace, migrate and free while the
// sweeper runs and one server restarts; afterwards the books must balance:
// no physical slab is used twice, every server's used count matches the
// replicas on it, and the servers hold exactly the keys of live replicas.
func TestConcurrentInvariants(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, store.NewMem())
	for i := range 6 {
		e.addServer(fmt.Sprintf("s%d", i), 12, "")
	}
	var wg sync.WaitGroup
	for a := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(a), 99))
			l, err := e.c.CreateLease(pool.CreateLeaseRequest{Agent: fmt.Sprintf("a%d", a), TTL: pool.Duration(time.Hour)})
			if err != nil {
				t.Error(err)
				return
			}
			var mine []pool.SlabID
			for range 200 {
				switch rnd.IntN(5) {
				case 0, 1:
					v, err := e.c.Allocate(ctx, l.ID, pool.AllocateRequest{Slabs: 1 + rnd.IntN(2), Replicas: 1 + rnd.IntN(3)})
					if err != nil && !errors.Is(err, pool.ErrNoCapacity) && !errors.Is(err, pool.ErrGrantFailed) && !errors.Is(err, pool.ErrStaleInstance) {
						t.Error(err)
					}
					for _, s := range v {
						mine = append(mine, s.ID)
					}
				case 2:
					if len(mine) > 0 {
						k := rnd.IntN(len(mine))
						if err := e.c.FreeSlab(ctx, l.ID, mine[k]); err != nil {
							t.Error(err)
						}
						mine = append(mine[:k], mine[k+1:]...)
					}
				case 3:
					if len(mine) > 0 {
						sid := mine[rnd.IntN(len(mine))]
						views := e.c.Slabs(coord.SlabFilter{Lease: l.ID})
						for _, v := range views {
							if v.ID != sid {
								continue
							}
							from := v.Replicas[0].Server
							if _, err := e.c.Replace(ctx, l.ID, sid, from); err == nil {
								if err := e.c.Migrated(ctx, l.ID, sid, from); err != nil {
									t.Error(err)
								}
							}
						}
					}
				default:
					if _, err := e.c.Renew(l.ID, pool.RenewRequest{}); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			e.c.Tick(ctx)
			if i == 25 { // a server restarts under load
				info := e.infos["s3"]
				info.Instance = e.ss.Get("s3").Restart()
				if err := e.c.Leave("s3"); err != nil { // a clean restart
					t.Error(err)
				}
				if _, err := e.c.Register(info); err != nil {
					t.Error(err)
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	wg.Wait()
	e.c.WaitFrees()
	e.tick(ctx)

	type phys struct {
		server pool.ServerID
		index  pool.SlabIndex
	}
	seen := map[phys]bool{}
	onServer := map[pool.ServerID]int{}
	keys := map[pool.ServerID]map[pool.SlabIndex]bool{}
	for _, l := range e.c.Leases() {
		for _, s := range e.c.Slabs(coord.SlabFilter{Lease: l.ID}) {
			for _, r := range s.Replicas {
				if r.State == "lost" {
					continue
				}
				p := phys{r.Server, r.Index}
				if seen[p] {
					t.Fatalf("physical slab %v used twice", p)
				}
				seen[p] = true
				onServer[r.Server]++
				if keys[r.Server] == nil {
					keys[r.Server] = map[pool.SlabIndex]bool{}
				}
				keys[r.Server][r.Index] = true
			}
		}
	}
	for _, sv := range e.c.Servers() {
		if sv.UsedSlabs != onServer[sv.ID] {
			t.Errorf("server %s: used %d, replicas %d", sv.ID, sv.UsedSlabs, onServer[sv.ID])
		}
		held := e.ss.Get(sv.ID).Keys()
		if len(held) != len(keys[sv.ID]) {
			t.Errorf("server %s holds %d keys, %d live replicas", sv.ID, len(held), len(keys[sv.ID]))
		}
		for i := range held {
			if !keys[sv.ID][i] {
				t.Errorf("server %s: leaked key on slab %d", sv.ID, i)
			}
		}
	}
}
