package swapfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"

	"rmem/pager/remote"
)

// Names of the files in the mount.
const (
	SwapName  = "swap"
	StatsName = "stats"
)

const (
	rootIno  = 1
	swapIno  = 2
	statsIno = 3
)

// MaxRequest is the largest READ or WRITE the mount asks the kernel for.
const MaxRequest = 1 << 20

// ErrOptions: invalid Options (the error names the field).
var ErrOptions = errors.New("swapfs: invalid options")

// Options configure a FS.
type Options struct {
	Size    uint64       // bytes in the swap file, a multiple of 4096; required
	Store   remote.Store // where blocks live; required
	Workers int          // concurrent pool transfers (PageIOs), default 4
	// Retry is how long a READ or WRITE that finds no replica reachable is
	// retried before it fails with EIO (default 30s).
	Retry time.Duration
	Log   *zap.Logger
}

// Validate checks the options, naming the bad field.
func (o *Options) Validate() error {
	switch {
	case o.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrOptions)
	case o.Size == 0 || o.Size%BlockSize != 0:
		return fmt.Errorf("%w: Size %d: want a positive multiple of %d", ErrOptions, o.Size, BlockSize)
	case o.Workers < 0 || o.Workers > 256:
		return fmt.Errorf("%w: Workers %d: want 1..256", ErrOptions, o.Workers)
	case o.Retry < 0:
		return fmt.Errorf("%w: Retry %v is negative", ErrOptions, o.Retry)
	}
	if s := o.Store.SlabSize(); s == 0 || s%BlockSize != 0 {
		return fmt.Errorf("%w: Store slab size %d is not a multiple of %d", ErrOptions, s, BlockSize)
	}
	return nil
}

// worker is one PageIO with its preallocated op array.
type worker struct {
	io  remote.PageIO
	ops []remote.PageOp
	idx []SlabIndex // SlabIndex of each op
}

// maxOps bounds the ops of one batch: a 1 MiB request spans at most 257
// blocks, and a vectored write adds one op per buffer boundary.
const maxOps = MaxRequest/BlockSize + 16

// FS is the filesystem. It implements fuse.RawFileSystem.
type FS struct {
	fuse.RawFileSystem

	opts    Options
	lay     layout
	written bitmap
	slabIDs []atomic.Uint64 // remote.SlabID per SlabIndex, 0 until allocated
	allocMu sync.Mutex      // serializes slab allocation

	workers chan *worker
	results sync.Pool // *readResult
	log     *zap.Logger
	c       counters

	ctx    context.Context // for pool calls; cancelled by Close
	cancel context.CancelFunc
	once   sync.Once
}

var _ fuse.RawFileSystem = (*FS)(nil)

// New returns a FS over opts.Store. It opens its PageIOs now; Close
// releases them and frees its slabs.
func New(opts Options) (*FS, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	if opts.Retry == 0 {
		opts.Retry = 30 * time.Second
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	lay := layout{blocks: opts.Size / BlockSize, blocksPerSlab: opts.Store.SlabSize() / BlockSize}
	ctx, cancel := context.WithCancel(context.Background())
	fs := &FS{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		opts:          opts, lay: lay, written: newBitmap(lay.blocks),
		slabIDs: make([]atomic.Uint64, lay.slabs()),
		workers: make(chan *worker, opts.Workers),
		log:     opts.Log, ctx: ctx, cancel: cancel,
	}
	fs.results.New = func() any { return new(readResult) }
	for range opts.Workers {
		io, err := opts.Store.OpenIO()
		if err != nil {
			fs.Close()
			return nil, fmt.Errorf("swapfs: open io: %w", err)
		}
		fs.workers <- &worker{io: io, ops: make([]remote.PageOp, 0, maxOps), idx: make([]SlabIndex, 0, maxOps)}
	}
	return fs, nil
}

// Close closes the PageIOs and frees the slabs. Safe to call twice; call it
// after the filesystem is unmounted.
func (fs *FS) Close() error {
	var err error
	fs.once.Do(func() {
		fs.cancel()
		for len(fs.workers) > 0 {
			w := <-fs.workers
			w.io.Close()
		}
		var ids []remote.SlabID
		for i := range fs.slabIDs {
			if id := fs.slabIDs[i].Load(); id != 0 {
				ids = append(ids, remote.SlabID(id))
			}
		}
		if len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if e := fs.opts.Store.Free(ctx, ids); e != nil {
				err = fmt.Errorf("swapfs: free %d slabs: %w", len(ids), e)
			}
		}
	})
	return err
}

// Stats returns the counters.
func (fs *FS) Stats() Stats {
	return Stats{
		Size: fs.opts.Size, SlabSize: fs.opts.Store.SlabSize(),
		Slabs: fs.c.slabs.Load(), BlocksWritten: fs.written.count(),
		Reads: fs.c.reads.Load(), Writes: fs.c.writes.Load(),
		ReadBytes: fs.c.readBytes.Load(), WriteBytes: fs.c.writeBytes.Load(),
		PoolReadOps: fs.c.poolReadOps.Load(), PoolWriteOps: fs.c.poolWriteOps.Load(),
		PoolReadBytes: fs.c.poolReadBytes.Load(), PoolWriteBytes: fs.c.poolWriteBytes.Load(),
		ZeroBlocks: fs.c.zero.Load(), Retries: fs.c.retries.Load(), Errors: fs.c.errors.Load(),
		ChecksumErrors: fs.c.checksumErrors.Load(),
	}
}

func (fs *FS) String() string { return "rmem-swapfs" }

// slab returns the pool slab of index i, allocating it if alloc is set.
// It returns 0 if the slab does not exist and alloc is not set.
func (fs *FS) slab(i SlabIndex, alloc bool) (remote.SlabID, error) {
	if id := fs.slabIDs[i].Load(); id != 0 || !alloc {
		return remote.SlabID(id), nil
	}
	fs.allocMu.Lock()
	defer fs.allocMu.Unlock()
	if id := fs.slabIDs[i].Load(); id != 0 {
		return remote.SlabID(id), nil
	}
	ids, err := fs.opts.Store.Alloc(fs.ctx, 1)
	if err != nil {
		return 0, err
	}
	fs.slabIDs[i].Store(uint64(ids[0]))
	fs.c.slabs.Add(1)
	fs.log.Debug("slab allocated", zap.Uint64("index", uint64(i)), zap.Uint64("slab", uint64(ids[0])))
	return ids[0], nil
}

// ReadAt fills buf from the swap file at off: written blocks from the pool,
// the others with zeros. buf must not extend past the end of the file.
func (fs *FS) ReadAt(buf []byte, off uint64) error {
	w := <-fs.workers
	defer func() { fs.workers <- w }()
	w.reset()
	var err error
	pos := uint64(0)
	segments(off, uint64(len(buf)), func(s segment) bool {
		dst := buf[pos : pos+s.n]
		pos += s.n
		if !fs.written.has(s.block) {
			clear(dst)
			fs.c.zero.Add(1)
			return true
		}
		si, soff := fs.lay.slabOf(s.block)
		id, _ := fs.slab(si, false) // written implies allocated
		if !w.add(si, id, soff+s.inner, dst) {
			if err = fs.run(w, false); err != nil {
				return false
			}
			w.add(si, id, soff+s.inner, dst)
		}
		return true
	})
	if err == nil {
		err = fs.run(w, false)
	}
	return err
}

// WriteAt writes the buffers, back to back, to the swap file at off. The
// range must not extend past the end of the file.
func (fs *FS) WriteAt(bufs [][]byte, off uint64) error {
	w := <-fs.workers
	defer func() { fs.workers <- w }()
	w.reset()
	var err error
	bi, bpos := 0, 0 // position in bufs
	total := uint64(0)
	for _, b := range bufs {
		total += uint64(len(b))
	}
	segments(off, total, func(s segment) bool {
		si, soff := fs.lay.slabOf(s.block)
		var id remote.SlabID
		if id, err = fs.slab(si, true); err != nil {
			return false
		}
		// A segment may straddle buffers: one op per piece.
		for left, at := s.n, soff+s.inner; left > 0; {
			for bpos == len(bufs[bi]) {
				bi, bpos = bi+1, 0
			}
			n := min(left, uint64(len(bufs[bi])-bpos))
			src := bufs[bi][bpos : bpos+int(n)]
			if !w.add(si, id, at, src) {
				if err = fs.run(w, true); err != nil {
					return false
				}
				w.add(si, id, at, src)
			}
			bpos += int(n)
			left -= n
			at += n
		}
		return true
	})
	if err == nil {
		err = fs.run(w, true)
	}
	return err
}

// run executes w.ops (READs or WRITEs), retrying while no replica is
// reachable, marks written blocks, and empties w.ops.
func (fs *FS) run(w *worker, write bool) error {
	ops := w.ops
	defer w.reset()
	if len(ops) == 0 {
		return nil
	}
	deadline := time.Now().Add(fs.opts.Retry)
	for attempt := 0; ; attempt++ {
		var err error
		if write {
			err = w.io.Write(fs.ctx, ops)
		} else {
			err = w.io.Read(fs.ctx, ops)
			for i := range ops {
				fs.c.checksumErrors.Add(uint64(ops[i].Corrupt))
			}
		}
		if err != nil {
			return err
		}
		err = firstErr(ops)
		if err == nil {
			break
		}
		if !errors.Is(err, remote.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		fs.c.retries.Add(1)
		if attempt == 0 {
			fs.log.Warn("no replica reachable, retrying", zap.Bool("write", write), zap.Error(err))
		}
		select {
		case <-fs.ctx.Done():
			return remote.ErrClosed
		case <-time.After(min(10*time.Millisecond<<min(attempt, 6), time.Second)):
		}
		for i := range ops {
			ops[i].Err = nil
		}
	}
	var n uint64
	for i := range ops {
		n += uint64(len(ops[i].Buf))
	}
	if write {
		fs.c.poolWriteOps.Add(uint64(len(ops)))
		fs.c.poolWriteBytes.Add(n)
		for i := range ops {
			fs.markWritten(w.idx[i], ops[i])
		}
	} else {
		fs.c.poolReadOps.Add(uint64(len(ops)))
		fs.c.poolReadBytes.Add(n)
	}
	return nil
}

// markWritten sets the written bit of every block op touched in slab si.
func (fs *FS) markWritten(si SlabIndex, op remote.PageOp) {
	base := uint64(si) * fs.lay.blocksPerSlab
	for b := op.Off / BlockSize; b <= (op.Off+uint64(len(op.Buf))-1)/BlockSize; b++ {
		fs.written.set(Block(base + b))
	}
}

func (w *worker) reset() {
	w.ops, w.idx = w.ops[:0], w.idx[:0]
}

func firstErr(ops []remote.PageOp) error {
	for i := range ops {
		if ops[i].Err != nil {
			return ops[i].Err
		}
	}
	return nil
}

// FUSE: the namespace is fixed (/, /swap, /stats).

func (fs *FS) attr(ino uint64, a *fuse.Attr) {
	*a = fuse.Attr{Ino: ino, Nlink: 1, Blksize: BlockSize}
	switch ino {
	case rootIno:
		a.Mode, a.Nlink = fuse.S_IFDIR|0o755, 2
	case swapIno:
		a.Mode, a.Size = fuse.S_IFREG|0o600, fs.opts.Size
		a.Blocks = fs.opts.Size / 512
	case statsIno:
		a.Mode = fuse.S_IFREG | 0o444
	}
}

// Lookup implements fuse.RawFileSystem.
func (fs *FS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if h.NodeId != rootIno {
		return fuse.ENOTDIR
	}
	var ino uint64
	switch name {
	case SwapName:
		ino = swapIno
	case StatsName:
		ino = statsIno
	default:
		return fuse.ENOENT
	}
	out.NodeId = ino
	out.SetEntryTimeout(time.Hour)
	out.SetAttrTimeout(time.Hour)
	fs.attr(ino, &out.Attr)
	return fuse.OK
}

// Forget implements fuse.RawFileSystem: the inodes are static.
func (fs *FS) Forget(uint64, uint64) {}

// GetAttr implements fuse.RawFileSystem.
func (fs *FS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.NodeId < rootIno || in.NodeId > statsIno {
		return fuse.ENOENT
	}
	out.SetTimeout(time.Hour)
	fs.attr(in.NodeId, &out.Attr)
	return fuse.OK
}

// SetAttr implements fuse.RawFileSystem: the size is fixed; mode, owner and
// times changes are accepted and ignored (losetup and swapon may touch
// them).
func (fs *FS) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.NodeId != swapIno {
		return fuse.EPERM
	}
	if in.Valid&fuse.FATTR_SIZE != 0 && in.Size != fs.opts.Size {
		return fuse.EPERM
	}
	out.SetTimeout(time.Hour)
	fs.attr(in.NodeId, &out.Attr)
	return fuse.OK
}

// Open implements fuse.RawFileSystem: every file is direct I/O.
func (fs *FS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	switch in.NodeId {
	case swapIno:
	case statsIno:
		if in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY {
			return fuse.EACCES
		}
	default:
		return fuse.EISDIR
	}
	out.OpenFlags = fuse.FOPEN_DIRECT_IO
	return fuse.OK
}

// readResult returns bytes already in go-fuse's buffer; pooled so that a
// READ allocates nothing.
type readResult struct {
	fs   *FS
	data []byte
}

func (r *readResult) Bytes([]byte) ([]byte, fuse.Status) { return r.data, fuse.OK }
func (r *readResult) Size() int                          { return len(r.data) }
func (r *readResult) Done()                              { r.data = nil; r.fs.results.Put(r) }

// Read implements fuse.RawFileSystem.
func (fs *FS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.NodeId == statsIno {
		return fs.readStats(in, buf)
	}
	if in.NodeId != swapIno {
		return nil, fuse.EISDIR
	}
	n := uint64(min(uint32(len(buf)), in.Size))
	if in.Offset >= fs.opts.Size {
		n = 0
	} else {
		n = min(n, fs.opts.Size-in.Offset)
	}
	fs.c.reads.Add(1)
	if err := fs.ReadAt(buf[:n], in.Offset); err != nil {
		fs.c.errors.Add(1)
		fs.log.Error("read failed", zap.Uint64("offset", in.Offset), zap.Uint64("bytes", n), zap.Error(err))
		return nil, fuse.EIO
	}
	fs.c.readBytes.Add(n)
	r := fs.results.Get().(*readResult)
	r.fs, r.data = fs, buf[:n]
	return r, fuse.OK
}

func (fs *FS) readStats(in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	b, err := json.Marshal(fs.Stats())
	if err != nil {
		return nil, fuse.EIO
	}
	b = append(b, '\n')
	if in.Offset >= uint64(len(b)) {
		return fuse.ReadResultData(nil), fuse.OK
	}
	n := copy(buf, b[in.Offset:])
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// Write implements fuse.RawFileSystem (go-fuse calls Writev first).
func (fs *FS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	one := [1][]byte{data}
	return fs.Writev(cancel, in, one[:])
}

// Writev implements fuse.RawFileSystem: the request's buffers go to the
// pool as they are.
func (fs *FS) Writev(_ <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.NodeId != swapIno {
		return 0, fuse.EBADF
	}
	var n uint64
	for _, b := range data {
		n += uint64(len(b))
	}
	if in.Offset > fs.opts.Size || n > fs.opts.Size-in.Offset {
		return 0, fuse.Status(syscall.EFBIG)
	}
	fs.c.writes.Add(1)
	if err := fs.WriteAt(data, in.Offset); err != nil {
		fs.c.errors.Add(1)
		fs.log.Error("write failed", zap.Uint64("offset", in.Offset), zap.Uint64("bytes", n), zap.Error(err))
		return 0, fuse.EIO
	}
	fs.c.writeBytes.Add(n)
	return uint32(n), fuse.OK
}

// Flush implements fuse.RawFileSystem: nothing is buffered.
func (fs *FS) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status { return fuse.OK }

// Fsync implements fuse.RawFileSystem: a WRITE is on every trusted replica
// when it returns.
func (fs *FS) Fsync(<-chan struct{}, *fuse.FsyncIn) fuse.Status { return fuse.OK }

// Release implements fuse.RawFileSystem.
func (fs *FS) Release(<-chan struct{}, *fuse.ReleaseIn) {}

// OpenDir implements fuse.RawFileSystem.
func (fs *FS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, _ *fuse.OpenOut) fuse.Status {
	if in.NodeId != rootIno {
		return fuse.ENOTDIR
	}
	return fuse.OK
}

// ReadDir implements fuse.RawFileSystem.
func (fs *FS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	entries := [...]fuse.DirEntry{
		{Name: ".", Ino: rootIno, Mode: fuse.S_IFDIR},
		{Name: "..", Ino: rootIno, Mode: fuse.S_IFDIR},
		{Name: SwapName, Ino: swapIno, Mode: fuse.S_IFREG},
		{Name: StatsName, Ino: statsIno, Mode: fuse.S_IFREG},
	}
	for i := in.Offset; i < uint64(len(entries)); i++ {
		e := entries[i]
		e.Off = i + 1
		if !out.AddDirEntry(e) {
			break
		}
	}
	return fuse.OK
}

// ReleaseDir implements fuse.RawFileSystem.
func (fs *FS) ReleaseDir(*fuse.ReleaseIn) {}

// StatFs implements fuse.RawFileSystem.
func (fs *FS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	*out = fuse.StatfsOut{Blocks: fs.lay.blocks, Bsize: BlockSize, Frsize: BlockSize, Files: 2, NameLen: 255}
	return fuse.OK
}
