package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// More errors, of the etcd store.
var (
	// ErrFenced: an Update of a fenced view found its election key gone or
	// recreated: another coordinator may lead now, and nothing was written.
	ErrFenced = errors.New("store: fenced: this coordinator's election key is gone (another may lead)")
	// ErrConflict: an Update kept meeting concurrent writes to what it read.
	ErrConflict = errors.New("store: too many conflicting concurrent updates")
	// ErrTxnTooLarge: an Update has more operations than etcd accepts in
	// one transaction (its --max-txn-ops).
	ErrTxnTooLarge = errors.New("store: transaction too large for etcd")
	// ErrStoreURL is wrapped by errors about a --store value.
	ErrStoreURL = errors.New("store: invalid store URL")
)

// DefaultEtcdPrefix is where the pool's keys live when the URL names none.
const DefaultEtcdPrefix = "/rmem"

// ParseEtcdURL parses etcd://HOST:PORT[,HOST:PORT...][/PREFIX] into the
// client endpoints (http://HOST:PORT) and the key prefix (default
// DefaultEtcdPrefix; no trailing slash).
func ParseEtcdURL(s string) (endpoints []string, prefix string, err error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s (want etcd://HOST:PORT[,HOST:PORT...][/PREFIX])", ErrStoreURL, s, fmt.Sprintf(format, args...))
	}
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok {
		if strings.HasPrefix(s, "etcds://") {
			return nil, "", bad("TLS to etcd is not supported yet")
		}
		return nil, "", bad("the scheme must be etcd://")
	}
	if strings.ContainsAny(rest, "?#@ \t\n") {
		return nil, "", bad("no user, query, fragment or spaces allowed")
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if hosts == "" {
		return nil, "", bad("no etcd endpoint")
	}
	seen := map[string]bool{}
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" {
			return nil, "", bad("endpoint %q is not HOST:PORT", h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, "", bad("endpoint %q: port must be 1-65535", h)
		}
		if seen[h] {
			return nil, "", bad("endpoint %q is listed twice", h)
		}
		seen[h] = true
		endpoints = append(endpoints, "http://"+h)
	}
	prefix = DefaultEtcdPrefix
	if path = strings.TrimRight(path, "/"); path != "" {
		for _, seg := range strings.Split(path, "/") {
			if seg == "" || seg == "." || seg == ".." {
				return nil, "", bad("prefix %q has an empty, . or .. segment", "/"+path)
			}
			for _, r := range seg {
				if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
					return nil, "", bad("prefix %q: only letters, digits, - _ . and / are allowed", "/"+path)
				}
			}
		}
		prefix = "/" + path
	}
	return endpoints, prefix, nil
}

// EtcdOptions configure OpenEtcd.
type EtcdOptions struct {
	Endpoints []string // required: http://HOST:PORT of the etcd members
	Prefix    string   // every key lives under it (default DefaultEtcdPrefix)
	// DialTimeout bounds the reachability check of OpenEtcd (default 5s).
	DialTimeout time.Duration
	// OpTimeout bounds each etcd request (default 5s).
	OpTimeout time.Duration
	// MaxTxnOps is the largest transaction etcd accepts (its
	// --max-txn-ops, default 128). An Update writing more keys fails with
	// ErrTxnTooLarge instead of a less clear etcd error.
	MaxTxnOps int
	Log       *zap.Logger // the etcd client's log (default: none)
}

// Etcd is a Store in etcd: bucket b's key k is PREFIX/b/k. Updates are
// optimistic transactions: each records the revisions of what fn read (one
// read revision per transaction) and commits with one etcd Txn comparing
// them, so a concurrent writer makes fn run again. Updates of one Etcd are
// serialised in process (they would only conflict with each other).
//
// Fenced returns a view whose Updates also require an election key to
// exist at its creation revision: the coordinator's writes are conditional
// on its leadership.
type Etcd struct {
	cli    *clientv3.Client
	prefix string
	opts   EtcdOptions
	mu     sync.Mutex // serialises Updates
	closed atomic.Bool
}

var _ Store = (*Etcd)(nil)

// OpenEtcd connects to etcd and checks, within DialTimeout, that it
// answers.
func OpenEtcd(opts EtcdOptions) (*Etcd, error) {
	if len(opts.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrStoreURL)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultEtcdPrefix
	}
	opts.Prefix = strings.TrimRight(opts.Prefix, "/")
	if !strings.HasPrefix(opts.Prefix, "/") {
		return nil, fmt.Errorf("%w: prefix %q must start with /", ErrStoreURL, opts.Prefix)
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.OpTimeout <= 0 {
		opts.OpTimeout = 5 * time.Second
	}
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = 128
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: opts.Endpoints, DialTimeout: opts.DialTimeout, Logger: opts.Log,
		// Find a dead member's connection broken within seconds.
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("store: etcd %s: %w", strings.Join(opts.Endpoints, ","), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.DialTimeout)
	defer cancel()
	if _, err := cli.Get(ctx, opts.Prefix+"/meta/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("store: etcd %s did not answer within %v (is it running, and is this the client URL?): %w",
			strings.Join(opts.Endpoints, ","), opts.DialTimeout, err)
	}
	return &Etcd{cli: cli, prefix: opts.Prefix, opts: opts}, nil
}

// Client returns the etcd client (the election shares it).
func (s *Etcd) Client() *clientv3.Client { return s.cli }

// Prefix returns the key prefix.
func (s *Etcd) Prefix() string { return s.prefix }

// Endpoints returns the etcd endpoints.
func (s *Etcd) Endpoints() []string { return slices.Clone(s.opts.Endpoints) }

// TermKey is the key every fenced Update writes: "REV OWNER" of the
// election term that wrote last (an audit trail in etcd's history: the
// writers' terms never interleave).
func (s *Etcd) TermKey() string { return s.prefix + "/term" }

// View implements Store.
func (s *Etcd) View(fn func(Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return fn(&etcdTx{s: s})
}

// Update implements Store.
func (s *Etcd) Update(fn func(Tx) error) error { return s.update(nil, fn) }

// Close implements Store.
func (s *Etcd) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.cli.Close()
}

// Fence makes Updates conditional on an election key.
type Fence struct {
	Key   string // the election key
	Rev   int64  // its creation revision when this term began
	Owner string // who holds it (written to TermKey)
	// Ctx, if set, ends with the term: the view's etcd requests are
	// canceled then, and later Updates fail with ErrFenced.
	Ctx context.Context
}

// Fenced returns a Store over s whose Updates commit only while f.Key
// exists with creation revision f.Rev, and fail with ErrFenced otherwise.
// Closing it does not close s.
func (s *Etcd) Fenced(f Fence) Store { return &fencedEtcd{s: s, f: f} }

type fencedEtcd struct {
	s      *Etcd
	f      Fence
	closed atomic.Bool
}

func (v *fencedEtcd) View(fn func(Tx) error) error {
	if v.closed.Load() {
		return ErrClosed
	}
	if v.s.closed.Load() {
		return ErrClosed
	}
	return fn(&etcdTx{s: v.s, parent: v.f.Ctx})
}

func (v *fencedEtcd) Update(fn func(Tx) error) error {
	if v.closed.Load() {
		return ErrClosed
	}
	return v.s.update(&v.f, fn)
}

func (v *fencedEtcd) Close() error { v.closed.Store(true); return nil }

const maxAttempts = 16

func (s *Etcd) key(b Bucket, k string) string { return s.prefix + "/" + string(b) + "/" + k }

func (s *Etcd) update(f *Fence, fn func(Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	parent := context.Background()
	if f != nil && f.Ctx != nil {
		parent = f.Ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if parent.Err() != nil {
			return fmt.Errorf("%w: the term ended", ErrFenced)
		}
		tx := &etcdTx{s: s, parent: parent, writable: true, reads: map[string]int64{}, writes: map[string][]byte{}}
		if err := fn(tx); err != nil {
			return err
		}
		if len(tx.writes) == 0 {
			return nil
		}
		var cmps []clientv3.Cmp
		for k, rev := range tx.reads {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
		}
		for _, b := range tx.ranges {
			start := s.key(b, "")
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(start), "<", tx.rev+1).WithRange(clientv3.GetPrefixRangeEnd(start)))
		}
		keys := make([]string, 0, len(tx.writes))
		for k := range tx.writes {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		ops := make([]clientv3.Op, 0, len(keys)+1)
		for _, k := range keys {
			if v := tx.writes[k]; v == nil {
				ops = append(ops, clientv3.OpDelete(k))
			} else {
				ops = append(ops, clientv3.OpPut(k, string(v)))
			}
		}
		var orElse []clientv3.Op
		if f != nil {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev))
			ops = append(ops, clientv3.OpPut(s.TermKey(), strconv.FormatInt(f.Rev, 10)+" "+f.Owner))
			orElse = append(orElse, clientv3.OpGet(f.Key))
		}
		if len(ops) > s.opts.MaxTxnOps {
			return fmt.Errorf("%w: %d operations, etcd takes at most %d (raise etcd's --max-txn-ops and memd's to match)", ErrTxnTooLarge, len(ops), s.opts.MaxTxnOps)
		}
		ctx, cancel := context.WithTimeout(parent, s.opts.OpTimeout)
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(orElse...).Commit()
		cancel()
		if err != nil {
			if parent.Err() != nil {
				// Whether it committed or not, the term is over: report
				// it as fenced (the caller applies nothing in memory).
				return fmt.Errorf("%w: the term ended during the commit: %v", ErrFenced, err)
			}
			return fmt.Errorf("store: etcd commit: %w", err)
		}
		if resp.Succeeded {
			return nil
		}
		if f != nil {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != f.Rev {
				return ErrFenced
			}
		}
		// Something fn read changed: run it again on the new state.
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
	return ErrConflict
}

// etcdTx reads at one revision (the first read's) and buffers writes.
type etcdTx struct {
	s        *Etcd
	parent   context.Context // nil: Background
	writable bool
	rev      int64             // read revision; 0 until the first read
	reads    map[string]int64  // key → mod revision seen (0: missing)
	ranges   []Bucket          // buckets read whole
	writes   map[string][]byte // full key → value (nil: deleted)
}

func (tx *etcdTx) ctx() context.Context {
	if tx.parent == nil {
		return context.Background()
	}
	return tx.parent
}

func (tx *etcdTx) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if tx.rev != 0 {
		opts = append(opts, clientv3.WithRev(tx.rev))
	}
	resp, err := tx.s.cli.Get(ctx, key, opts...)
	if err != nil {
		return nil, fmt.Errorf("store: etcd read: %w", err)
	}
	if tx.rev == 0 {
		tx.rev = resp.Header.Revision
	}
	return resp, nil
}

func check(b Bucket, key string) error {
	if !validBucket(b) {
		return fmt.Errorf("%w: %q", ErrUnknownBucket, b)
	}
	if key == "" {
		return ErrEmptyKey
	}
	return nil
}

func (tx *etcdTx) Get(b Bucket, key string) ([]byte, error) {
	if err := check(b, key); err != nil {
		return nil, err
	}
	k := tx.s.key(b, key)
	if v, ok := tx.writes[k]; ok {
		if v == nil {
			return nil, ErrNotFound
		}
		return v, nil
	}
	ctx, cancel := context.WithTimeout(tx.ctx(), tx.s.opts.OpTimeout)
	defer cancel()
	resp, err := tx.get(ctx, k)
	if err != nil {
		return nil, err
	}
	var rev int64
	var val []byte
	if len(resp.Kvs) > 0 {
		rev, val = resp.Kvs[0].ModRevision, resp.Kvs[0].Value
	}
	if tx.writable {
		tx.reads[k] = rev
	}
	if val == nil && rev == 0 {
		return nil, ErrNotFound
	}
	if val == nil {
		val = []byte{}
	}
	return val, nil
}

func (tx *etcdTx) set(b Bucket, key string, v []byte) error {
	if !tx.writable {
		return ErrReadOnly
	}
	if err := check(b, key); err != nil {
		return err
	}
	tx.writes[tx.s.key(b, key)] = v
	return nil
}

func (tx *etcdTx) Put(b Bucket, key string, val []byte) error {
	return tx.set(b, key, append(make([]byte, 0, len(val)+1), val...))
}

func (tx *etcdTx) Delete(b Bucket, key string) error { return tx.set(b, key, nil) }

const pageSize = 1000

func (tx *etcdTx) ForEach(b Bucket, fn func(key string, val []byte) error) error {
	if !validBucket(b) {
		return fmt.Errorf("%w: %q", ErrUnknownBucket, b)
	}
	base := tx.s.key(b, "")
	end := clientv3.GetPrefixRangeEnd(base)
	if tx.writable {
		tx.ranges = append(tx.ranges, b)
	}
	// Own writes in this bucket, merged in key order with the stored keys.
	var mine []string
	for k := range tx.writes {
		if strings.HasPrefix(k, base) {
			mine = append(mine, k)
		}
	}
	slices.Sort(mine)
	emitMine := func(upTo string, inclusive bool) error {
		for len(mine) > 0 && (mine[0] < upTo || inclusive && mine[0] == upTo || upTo == "") {
			k := mine[0]
			mine = mine[1:]
			if v := tx.writes[k]; v != nil {
				if err := fn(strings.TrimPrefix(k, base), v); err != nil {
					return err
				}
			}
		}
		return nil
	}
	from := base
	for {
		ctx, cancel := context.WithTimeout(tx.ctx(), tx.s.opts.OpTimeout)
		resp, err := tx.get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(pageSize),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		cancel()
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			if err := emitMine(k, false); err != nil {
				return err
			}
			if _, ok := tx.writes[k]; ok {
				continue // emitted (or deleted) as the transaction's own write
			}
			if err := fn(strings.TrimPrefix(k, base), kv.Value); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return emitMine("", true)
}
