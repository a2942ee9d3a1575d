package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// contract runs the Store contract against a fresh store from open; reopen
// (nil for Mem) closes and reopens the same data.
func contract(t *testing.T, open func(t *testing.T) Store, reopen func(t *testing.T, s Store) Store) {
	t.Run("put get delete", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		err := s.Update(func(tx Tx) error {
			if err := tx.Put(Servers, "a", []byte("1")); err != nil {
				return err
			}
			if v, err := tx.Get(Servers, "a"); err != nil || string(v) != "1" {
				return fmt.Errorf("own write: %q %v", v, err)
			}
			return tx.Put(Leases, "a", []byte("2"))
		})
		if err != nil {
			t.Fatal(err)
		}
		s.View(func(tx Tx) error {
			if v, err := tx.Get(Servers, "a"); err != nil || string(v) != "1" {
				t.Errorf("get: %q %v", v, err)
			}
			if _, err := tx.Get(Slabs, "a"); !errors.Is(err, ErrNotFound) {
				t.Errorf("missing: %v", err)
			}
			if err := tx.Put(Servers, "b", nil); !errors.Is(err, ErrReadOnly) {
				t.Errorf("put in view: %v", err)
			}
			return nil
		})
		if err := s.Update(func(tx Tx) error { return tx.Delete(Servers, "a") }); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(func(tx Tx) error { return tx.Delete(Servers, "never") }); err != nil {
			t.Fatalf("deleting a missing key: %v", err)
		}
		s.View(func(tx Tx) error {
			if _, err := tx.Get(Servers, "a"); !errors.Is(err, ErrNotFound) {
				t.Errorf("after delete: %v", err)
			}
			return nil
		})
	})
	t.Run("failed update applies nothing", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		boom := errors.New("boom")
		err := s.Update(func(tx Tx) error {
			tx.Put(Slabs, "x", []byte("1"))
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("got %v", err)
		}
		s.View(func(tx Tx) error {
			if _, err := tx.Get(Slabs, "x"); !errors.Is(err, ErrNotFound) {
				t.Errorf("write of a failed update is visible: %v", err)
			}
			return nil
		})
	})
	t.Run("foreach sorted with own writes", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		s.Update(func(tx Tx) error {
			for _, k := range []string{"c", "a", "b"} {
				tx.Put(Slabs, k, []byte(k))
			}
			return nil
		})
		var got []string
		s.Update(func(tx Tx) error {
			tx.Delete(Slabs, "b")
			tx.Put(Slabs, "d", []byte("d"))
			return tx.ForEach(Slabs, func(k string, v []byte) error {
				got = append(got, k+"="+string(v))
				return nil
			})
		})
		if fmt.Sprint(got) != "[a=a c=c d=d]" {
			t.Fatalf("ForEach saw %v", got)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		s.Update(func(tx Tx) error {
			if err := tx.Put("nope", "k", nil); !errors.Is(err, ErrUnknownBucket) {
				t.Errorf("unknown bucket: %v", err)
			}
			if err := tx.Put(Meta, "", nil); !errors.Is(err, ErrEmptyKey) {
				t.Errorf("empty key: %v", err)
			}
			return nil
		})
	})
	t.Run("concurrent updates", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 20 {
					s.Update(func(tx Tx) error { return tx.Put(Meta, fmt.Sprintf("%d-%d", i, j), []byte("v")) })
					s.View(func(tx Tx) error { return tx.ForEach(Meta, func(string, []byte) error { return nil }) })
				}
			}()
		}
		wg.Wait()
		n := 0
		s.View(func(tx Tx) error { return tx.ForEach(Meta, func(string, []byte) error { n++; return nil }) })
		if n != 160 {
			t.Fatalf("%d keys, want 160", n)
		}
	})
	t.Run("foreach over many keys", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		// More than one etcd page, written in transactions etcd accepts.
		for i := 0; i < 2500; i += 100 {
			err := s.Update(func(tx Tx) error {
				for j := i; j < i+100; j++ {
					if err := tx.Put(Slabs, fmt.Sprintf("%016x", j), []byte(fmt.Sprint(j))); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		err := s.View(func(tx Tx) error {
			return tx.ForEach(Slabs, func(k string, v []byte) error {
				if k != fmt.Sprintf("%016x", n) || string(v) != fmt.Sprint(n) {
					return fmt.Errorf("key %d: %s=%s", n, k, v)
				}
				n++
				return nil
			})
		})
		if err != nil || n != 2500 {
			t.Fatalf("ForEach saw %d keys: %v", n, err)
		}
		// Own writes interleave in order with the stored keys.
		var got []string
		s.Update(func(tx Tx) error {
			tx.Delete(Slabs, fmt.Sprintf("%016x", 1))
			tx.Put(Slabs, fmt.Sprintf("%016x", 2), []byte("two"))
			tx.Put(Slabs, fmt.Sprintf("%016x", 1)+"a", []byte("1a"))
			return tx.ForEach(Slabs, func(k string, v []byte) error {
				if len(got) < 4 {
					got = append(got, string(v))
				}
				return nil
			})
		})
		if fmt.Sprint(got) != "[0 1a two 3]" {
			t.Fatalf("ForEach with own writes saw %v", got)
		}
	})
	t.Run("views see whole updates", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				s.Update(func(tx Tx) error {
					tx.Put(Leases, "a", []byte(fmt.Sprint(i)))
					return tx.Put(Leases, "b", []byte(fmt.Sprint(i)))
				})
			}
			close(done)
		}()
		for {
			select {
			case <-done:
				wg.Wait()
				return
			default:
			}
			s.View(func(tx Tx) error {
				a, errA := tx.Get(Leases, "a")
				b, errB := tx.Get(Leases, "b")
				if (errA == nil) != (errB == nil) || string(a) != string(b) {
					t.Errorf("a view saw half an update: a=%q (%v) b=%q (%v)", a, errA, b, errB)
				}
				return nil
			})
		}
	})
	t.Run("closed", func(t *testing.T) {
		s := open(t)
		s.Close()
		if err := s.View(func(Tx) error { return nil }); !errors.Is(err, ErrClosed) {
			t.Errorf("view after close: %v", err)
		}
		if err := s.Update(func(Tx) error { return nil }); !errors.Is(err, ErrClosed) {
			t.Errorf("update after close: %v", err)
		}
		s.Close()
	})
	if reopen != nil {
		t.Run("durable across reopen", func(t *testing.T) {
			s := open(t)
			s.Update(func(tx Tx) error { return tx.Put(Leases, "l1", []byte("lease")) })
			s = reopen(t, s)
			defer s.Close()
			s.View(func(tx Tx) error {
				if v, err := tx.Get(Leases, "l1"); err != nil || string(v) != "lease" {
					t.Errorf("after reopen: %q %v", v, err)
				}
				return nil
			})
		})
	}
}

// TestStoreConformanceMemBoltEtcd runs the same contract over every Store: in memory,
// bbolt, and a real etcd.
func TestStoreConformanceMemBoltEtcd(t *testing.T) {
	t.Run("mem", func(t *testing.T) { contract(t, func(*testing.T) Store { return NewMem() }, nil) })
	t.Run("bolt", testBolt)
	t.Run("etcd", testEtcd)
}

func testBolt(t *testing.T) {
	dirs := map[Store]string{}
	open := func(t *testing.T) Store {
		dir := t.TempDir()
		s, err := OpenBolt(dir)
		if err != nil {
			t.Fatal(err)
		}
		dirs[s] = dir
		return s
	}
	reopen := func(t *testing.T, s Store) Store {
		dir := dirs[s]
		s.Close()
		s2, err := OpenBolt(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s2
	}
	contract(t, open, reopen)
}

func TestBoltLockedByAnother(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// bbolt's flock is per open file description, so a second Open in the
	// same process contends like another process would.
	if _, err := OpenBolt(dir); err == nil {
		t.Fatal("second open of a locked file succeeded")
	}
}
