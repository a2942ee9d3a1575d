package coord

import (
	"encoding/json"
	"fmt"
	"strconv"

	"rmem/pool"
	"rmem/pool/store"
)

// Records are JSON values under these keys:
//
//	servers/<server id>         pool.Server
//	leases/<lease id>           leaseRecord
//	slabs/<slab id, 16 hex>     pool.Slab
//	meta/next_slab              decimal SlabID
const metaNextSlab = "next_slab"

// leaseRecord is a lease as stored: with the hash of its secret, never the
// secret.
type leaseRecord struct {
	pool.Lease
	SecretSHA256 string `json:"secret_sha256,omitempty"`
}

func slabKey(id pool.SlabID) string { return fmt.Sprintf("%016x", uint64(id)) }

func put(tx store.Tx, b store.Bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Put(b, key, data)
}

func putNextSlab(tx store.Tx, next pool.SlabID) error {
	return tx.Put(store.Meta, metaNextSlab, []byte(strconv.FormatUint(uint64(next), 10)))
}

// load rebuilds the state from the store. Heartbeats and lease expiries
// restart from now (see the package comment).
func (c *Coordinator) load() error {
	now := c.clock.Now()
	err := c.opts.Store.View(func(tx store.Tx) error {
		if v, err := tx.Get(store.Meta, metaNextSlab); err == nil {
			n, perr := strconv.ParseUint(string(v), 10, 64)
			if perr != nil {
				return fmt.Errorf("meta/%s: %w", metaNextSlab, perr)
			}
			c.nextSlab = pool.SlabID(n)
		}
		err := tx.ForEach(store.Servers, func(k string, v []byte) error {
			s := &srv{lastHB: now} // not heard: "unknown" until it heartbeats
			if err := json.Unmarshal(v, &s.rec); err != nil {
				return fmt.Errorf("servers/%s: %w", k, err)
			}
			c.servers[s.rec.ID] = s
			c.srvList = append(c.srvList, s)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.ForEach(store.Leases, func(k string, v []byte) error {
			var rec leaseRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("leases/%s: %w", k, err)
			}
			rec.Secret = ""
			l := &lease{rec: rec.Lease, secret: rec.SecretSHA256, slabs: map[pool.SlabID]*pool.Slab{}}
			l.extendFrom(now)
			c.leases[l.rec.ID] = l
			return nil
		})
		if err != nil {
			return err
		}
		return tx.ForEach(store.Slabs, func(k string, v []byte) error {
			sl := &pool.Slab{}
			if err := json.Unmarshal(v, sl); err != nil {
				return fmt.Errorf("slabs/%s: %w", k, err)
			}
			l := c.leases[sl.Lease]
			if l == nil {
				return fmt.Errorf("slabs/%s: lease %q does not exist", k, sl.Lease)
			}
			l.slabs[sl.ID] = sl
			c.slabs[sl.ID] = sl
			if sl.ID >= c.nextSlab {
				c.nextSlab = sl.ID + 1
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("coord: loading state: %w", err)
	}
	for _, s := range c.servers {
		c.rebuildUsedLocked(s)
	}
	c.log.Info("state loaded", zapInt("servers", len(c.servers)), zapInt("leases", len(c.leases)), zapInt("slabs", len(c.slabs)))
	return nil
}
