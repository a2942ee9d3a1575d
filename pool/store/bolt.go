package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FileName is the name of the bbolt file inside the data directory.
const FileName = "memd.db"

// Bolt is a Store in a bbolt file.
type Bolt struct {
	db   *bolt.DB
	path string
}

var _ Store = (*Bolt)(nil)

// OpenBolt opens (creating if needed) dir/memd.db. The directory is created
// with mode 0700 and the file with 0600: it holds keys. A file another
// process has open fails after a second with an error saying so.
func OpenBolt(dir string) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// The freelist is rebuilt at open rather than written at every commit:
	// less to write per allocation, same durability.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("store: %s is locked by another process (is another memd running with this --data-dir?): %w", path, err)
		}
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range Buckets {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: init %s: %w", path, err)
	}
	return &Bolt{db: db, path: path}, nil
}

// Path returns the file's path.
func (s *Bolt) Path() string { return s.path }

func mapClosed(err error) error {
	if errors.Is(err, bolt.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// View implements Store.
func (s *Bolt) View(fn func(Tx) error) error {
	return mapClosed(s.db.View(func(tx *bolt.Tx) error { return fn(boltTx{tx}) }))
}

// Update implements Store.
func (s *Bolt) Update(fn func(Tx) error) error {
	return mapClosed(s.db.Update(func(tx *bolt.Tx) error { return fn(boltTx{tx}) }))
}

// Close implements Store.
func (s *Bolt) Close() error { return s.db.Close() }

type boltTx struct{ tx *bolt.Tx }

func (t boltTx) bucket(b Bucket, key string) (*bolt.Bucket, error) {
	if !validBucket(b) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownBucket, b)
	}
	if key == "" {
		return nil, ErrEmptyKey
	}
	return t.tx.Bucket([]byte(b)), nil
}

func (t boltTx) Get(b Bucket, key string) ([]byte, error) {
	bk, err := t.bucket(b, key)
	if err != nil {
		return nil, err
	}
	v := bk.Get([]byte(key))
	if v == nil {
		return nil, ErrNotFound
	}
	return v, nil
}

func (t boltTx) Put(b Bucket, key string, val []byte) error {
	if !t.tx.Writable() {
		return ErrReadOnly
	}
	bk, err := t.bucket(b, key)
	if err != nil {
		return err
	}
	if val == nil {
		val = []byte{}
	}
	return bk.Put([]byte(key), val)
}

func (t boltTx) Delete(b Bucket, key string) error {
	if !t.tx.Writable() {
		return ErrReadOnly
	}
	bk, err := t.bucket(b, key)
	if err != nil {
		return err
	}
	return bk.Delete([]byte(key))
}

func (t boltTx) ForEach(b Bucket, fn func(key string, val []byte) error) error {
	if !validBucket(b) {
		return fmt.Errorf("%w: %q", ErrUnknownBucket, b)
	}
	return t.tx.Bucket([]byte(b)).ForEach(func(k, v []byte) error { return fn(string(k), v) })
}
