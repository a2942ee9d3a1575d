package store

import (
	"fmt"
	"sort"
	"sync"
)

// Mem is an in-memory Store. Its zero value is not usable: call NewMem.
type Mem struct {
	mu     sync.RWMutex // held for reading by View, for writing by the commit of Update
	update sync.Mutex   // serialises Updates
	data   map[Bucket]map[string][]byte
	closed bool
}

var _ Store = (*Mem)(nil)

// NewMem returns an empty in-memory store.
func NewMem() *Mem {
	m := &Mem{data: map[Bucket]map[string][]byte{}}
	for _, b := range Buckets {
		m.data[b] = map[string][]byte{}
	}
	return m
}

// View implements Store.
func (m *Mem) View(fn func(Tx) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return fn(&memTx{m: m})
}

// Update implements Store.
func (m *Mem) Update(fn func(Tx) error) error {
	m.update.Lock()
	defer m.update.Unlock()
	m.mu.RLock()
	closed := m.closed
	m.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	// Only this goroutine writes m.data (update is held), so reading it
	// without mu while building the transaction is safe.
	tx := &memTx{m: m, writable: true, writes: map[Bucket]map[string][]byte{}}
	if err := fn(tx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for b, kv := range tx.writes {
		for k, v := range kv {
			if v == nil {
				delete(m.data[b], k)
			} else {
				m.data[b][k] = v
			}
		}
	}
	return nil
}

// Close implements Store.
func (m *Mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

type memTx struct {
	m        *Mem
	writable bool
	writes   map[Bucket]map[string][]byte // nil value: deleted
}

func (tx *memTx) check(b Bucket, key string) error {
	if !validBucket(b) {
		return fmt.Errorf("%w: %q", ErrUnknownBucket, b)
	}
	if key == "" {
		return ErrEmptyKey
	}
	return nil
}

func (tx *memTx) Get(b Bucket, key string) ([]byte, error) {
	if err := tx.check(b, key); err != nil {
		return nil, err
	}
	if v, ok := tx.writes[b][key]; ok {
		if v == nil {
			return nil, ErrNotFound
		}
		return v, nil
	}
	if v, ok := tx.m.data[b][key]; ok {
		return v, nil
	}
	return nil, ErrNotFound
}

func (tx *memTx) set(b Bucket, key string, v []byte) error {
	if !tx.writable {
		return ErrReadOnly
	}
	if err := tx.check(b, key); err != nil {
		return err
	}
	if tx.writes[b] == nil {
		tx.writes[b] = map[string][]byte{}
	}
	tx.writes[b][key] = v
	return nil
}

func (tx *memTx) Put(b Bucket, key string, val []byte) error {
	return tx.set(b, key, append(make([]byte, 0, len(val)+1), val...))
}

func (tx *memTx) Delete(b Bucket, key string) error { return tx.set(b, key, nil) }

func (tx *memTx) ForEach(b Bucket, fn func(key string, val []byte) error) error {
	if !validBucket(b) {
		return fmt.Errorf("%w: %q", ErrUnknownBucket, b)
	}
	keys := make([]string, 0, len(tx.m.data[b])+len(tx.writes[b]))
	for k := range tx.m.data[b] {
		if _, ok := tx.writes[b][k]; !ok {
			keys = append(keys, k)
		}
	}
	for k, v := range tx.writes[b] {
		if v != nil {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := tx.writes[b][k]
		if !ok {
			v = tx.m.data[b][k]
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}
