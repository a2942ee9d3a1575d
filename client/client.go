package client

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"rmem/pager/proto"
	"rmem/userfaultfd"
)

// Errors.
var (
	// ErrClosed: the Client was closed (or its agent connection failed).
	ErrClosed = errors.New("client: closed")
	// ErrNotMapped: Unmap of memory that Map did not return.
	ErrNotMapped = errors.New("client: not mapped by this client")
)

const pageSize = 4096

type region struct {
	id     uint64
	mem    []byte
	shared bool     // a MAP_SHARED mapping of a shmem file (MapShared)
	file   *os.File // that file, mapped from offset 0 (the caller's; nil for private memory)
}

// Client is one process's connection to memagent.
type Client struct {
	conn      *net.UnixConn
	path      string
	uffd      *userfaultfd.UFFD
	features  userfaultfd.Feature
	staging   []byte
	stagingFD int // kept: a resuming HELLO hands it to the next agent
	id        uint64

	mu      sync.Mutex
	regions map[uintptr]*region // by start address
	nextID  uint64
	seq     uint32
	waiters map[uint32]chan error
	err     error // set when the connection failed
	closed  bool
	sendMu  sync.Mutex
	sendBuf []byte

	done chan struct{}
}

// Options are Connect's choices beyond the socket.
type Options struct {
	// UserModeOnly takes a uffd for faults from user mode only
	// (userfaultfd.OpenUserMode), which any user may create: the kernel's
	// own accesses to missing pages of mapped memory (read(2) into it,
	// futexes in it) fail with EFAULT instead of waiting for the page.
	// For programs that touch their mapped memory only from Go code, such
	// as the pager's tests run without root.
	UserModeOnly bool
}

// Connect connects to the agent at path ("" means proto.SocketPath()),
// opens a userfaultfd (through the agent's /dev/userfaultfd if the kernel
// gives this user none: see proto.UFFDDevice) and starts the EVICT helper.
func Connect(path string) (*Client, error) { return ConnectWith(path, Options{}) }

// ConnectWith is Connect with opts.
func ConnectWith(path string, opts Options) (*Client, error) {
	if path == "" {
		path = proto.SocketPath()
	}
	if uint64(os.Getpagesize()) != pageSize {
		return nil, fmt.Errorf("client: page size %d is not supported", os.Getpagesize())
	}
	conn, err := proto.Dial(path)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	u, want, err := openUFFD(conn, opts.UserModeOnly)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c := &Client{conn: conn, path: path, uffd: u, features: want, stagingFD: -1, regions: map[uintptr]*region{},
		waiters: map[uint32]chan error{}, sendBuf: make([]byte, 0, proto.MaxPacket), done: make(chan struct{})}
	if err := c.hello(want); err != nil {
		conn.Close()
		u.Close()
		return nil, err
	}
	go c.routineHelper()
	return c, nil
}

// openUFFD makes this process's uffd, through /dev/userfaultfd lent by
// the agent on conn (UFFD_DEVICE, before HELLO) if the kernel gives this
// user none of its own, and returns it with the features enabled.
// userMode: a uffd of userfaultfd.OpenUserMode instead (Options).
func openUFFD(conn *net.UnixConn, userMode bool) (*userfaultfd.UFFD, userfaultfd.Feature, error) {
	dev := -1
	probe, open := userfaultfd.Probe, userfaultfd.Open
	if userMode {
		probe, open = userfaultfd.ProbeUserMode, userfaultfd.OpenUserMode
	}
	avail, _, err := probe()
	if !userMode && errors.Is(err, userfaultfd.ErrUnavailable) && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
		if dev, err = borrowDevice(conn); err == nil {
			defer unix.Close(dev)
			avail, _, err = userfaultfd.ProbeDevice(dev)
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("client: %w", err)
	}
	// No FeatureEventRemove: each REMOVE event would block our eviction's
	// MADV_DONTNEED until the agent read it (see preload's UFFD_FEATURES).
	want := userfaultfd.FeaturePagefaultFlagWP | userfaultfd.FeatureEventRemap |
		userfaultfd.FeatureEventUnmap
	if !avail.Has(want) {
		return nil, 0, fmt.Errorf("client: kernel lacks userfaultfd features %v: %w", want&^avail, userfaultfd.ErrFeature)
	}
	if avail.Has(userfaultfd.FeaturePoison) {
		want |= userfaultfd.FeaturePoison // lost pages raise SIGBUS
	}
	var u *userfaultfd.UFFD
	if dev >= 0 {
		u, err = userfaultfd.OpenDevice(dev, want)
	} else {
		u, err = open(want)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("client: %w", err)
	}
	return u, want, nil
}

// borrowDevice asks the agent for /dev/userfaultfd (proto.UFFDDevice).
func borrowDevice(conn *net.UnixConn) (int, error) {
	buf := make([]byte, 0, proto.MaxPacket)
	if err := proto.Send(conn, buf, 1, &proto.UFFDDevice{}); err != nil {
		return -1, err
	}
	var fds [proto.MaxFDs]int
	pkt, nfds, err := proto.Recv(conn, buf[:proto.MaxPacket], make([]byte, proto.OOBSize), fds[:])
	if err != nil {
		return -1, fmt.Errorf("waiting for the agent's /dev/userfaultfd: %w", err)
	}
	var ack proto.Ack
	if _, err = proto.Expect(pkt, &ack); err == nil && nfds != 1 {
		err = fmt.Errorf("the agent's ACK carried %d descriptors, want 1", nfds)
	}
	if err != nil {
		for _, fd := range fds[:nfds] {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("no userfaultfd of our own, and the agent lent none: %w", err)
	}
	return fds[0], nil
}

func (c *Client) hello(features userfaultfd.Feature) error {
	h := proto.Hello{PID: int32(os.Getpid()), PPID: int32(os.Getppid()), Features: features,
		PageSize: pageSize, Flags: proto.HelloUFFD}
	if err := proto.Send(c.conn, make([]byte, 0, proto.MaxPacket), 1, &h, c.uffd.Fd()); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	buf := make([]byte, proto.MaxPacket)
	var fds [proto.MaxFDs]int
	pkt, nfds, err := proto.Recv(c.conn, buf, make([]byte, proto.OOBSize), fds[:])
	if err != nil {
		return fmt.Errorf("client: waiting for WELCOME: %w", err)
	}
	var w proto.Welcome
	if _, err = proto.Expect(pkt, &w); err != nil {
		err = fmt.Errorf("client: agent refused: %w", err)
	} else if nfds != w.FDs() || nfds < 1 {
		err = fmt.Errorf("client: WELCOME carried %d descriptors, want %d", nfds, w.FDs())
	}
	var st []byte
	if err == nil {
		if st, err = unix.Mmap(fds[0], 0, int(w.StagingSlots)*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			err = fmt.Errorf("client: map staging area: %w", err)
		}
	}
	for i, fd := range fds[:nfds] {
		if i != 0 || err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		return err
	}
	c.staging, c.stagingFD, c.id = st, fds[0], w.ClientID
	return nil
}

// ID returns the client id the agent assigned.
func (c *Client) ID() uint64 { return c.id }

// Map returns size bytes (rounded up to whole pages) of zeroed private
// memory paged by the agent.
func (c *Client) Map(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("client: map %d bytes: %w", size, unix.EINVAL)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	n := (size + pageSize - 1) &^ (pageSize - 1)
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("client: mmap %d bytes: %w", n, err)
	}
	if err := c.announce(mem, nil); err != nil {
		return nil, err
	}
	return mem[:size:size], nil
}

// announce registers mem, just mapped, with the uffd and announces it to
// the agent as a region (shared: of kind proto.KindShared). On failure mem
// is unmapped.
func (c *Client) announce(mem []byte, file *os.File) error {
	kind := proto.KindMmap
	if file != nil {
		kind = proto.KindShared
	}
	rng := userfaultfd.Range{Start: userfaultfd.AddrOf(mem), Len: uint64(len(mem))}
	if _, err := c.uffd.Register(rng, userfaultfd.ModeMissing|userfaultfd.ModeWP); err != nil {
		unix.Munmap(mem)
		return fmt.Errorf("client: %w", err)
	}
	c.mu.Lock()
	c.nextID++
	r := &region{id: c.nextID, mem: mem, shared: file != nil, file: file}
	c.regions[uintptr(rng.Start)] = r
	c.mu.Unlock()
	if err := c.request(&proto.RegionAdd{ID: r.id, Range: rng, Kind: kind}); err != nil {
		c.mu.Lock()
		delete(c.regions, uintptr(rng.Start))
		c.mu.Unlock()
		c.uffd.Unregister(rng)
		unix.Munmap(mem)
		return fmt.Errorf("client: region add: %w", err)
	}
	return nil
}

// MapShared maps the first size bytes (whole pages) of f, a shmem file
// (tmpfs, memfd; one that holds no pages yet), shared, and has the agent
// page them as a region of kind proto.KindShared: evicting a page punches
// it out of the file (MADV_REMOVE), so that it leaves the file's pages,
// not only this mapping. It is how the agent pages a segment that other
// processes map (pager's shared.go): they see the pages this mapping
// installs in the file; it is not meant for a program's own use, since
// any other mapping of f would read an evicted page as a hole.
func (c *Client) MapShared(f *os.File, size int) ([]byte, error) {
	if size <= 0 || size%pageSize != 0 {
		return nil, fmt.Errorf("client: map %d shared bytes: %w", size, unix.EINVAL)
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("client: mmap %d shared bytes: %w", size, err)
	}
	// Not inherited by the agent's children: without FORK events their
	// copy would not be registered, and would read an evicted page as a
	// hole.
	unix.Madvise(mem, unix.MADV_DONTFORK)
	// Not locked (a process under mlockall(MCL_FUTURE), as memagent is):
	// MADV_REMOVE refuses locked memory.
	unix.Munlock(mem)
	if err := c.announce(mem, f); err != nil {
		return nil, err
	}
	return mem, nil
}

// Unmap releases memory returned by Map.
func (c *Client) Unmap(b []byte) error {
	if len(b) == 0 {
		return ErrNotMapped
	}
	start := uintptr(userfaultfd.AddrOf(b))
	c.mu.Lock()
	r := c.regions[start]
	delete(c.regions, start)
	c.mu.Unlock()
	if r == nil {
		return ErrNotMapped
	}
	rng := userfaultfd.Range{Start: userfaultfd.Addr(start), Len: uint64(len(r.mem))}
	err := c.request(&proto.RegionDel{ID: r.id, Range: rng})
	if errors.Is(err, ErrClosed) {
		err = nil // the agent forgets the region with the connection
	} else if err != nil {
		err = fmt.Errorf("client: region del: %w", err)
	}
	c.uffd.Unregister(rng)
	if e := unix.Munmap(r.mem); e != nil && err == nil {
		err = fmt.Errorf("client: munmap: %w", e)
	}
	return err
}

// request sends m and waits for its ACK or ERROR.
func (c *Client) request(m proto.Message) error {
	ch := make(chan error, 1)
	c.mu.Lock()
	if c.closed || c.err != nil {
		err := c.err
		c.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return err
	}
	c.seq++
	seq := c.seq
	c.waiters[seq] = ch
	c.mu.Unlock()
	if err := c.send(seq, m); err != nil {
		c.mu.Lock()
		delete(c.waiters, seq)
		c.mu.Unlock()
		return err
	}
	return <-ch
}

func (c *Client) send(seq uint32, m proto.Message) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return proto.Send(c.conn, c.sendBuf, seq, m)
}

// routineHelper reads the agent's messages: replies go to their waiters,
// EVICTs are served on this locked OS thread.
func (c *Client) routineHelper() {
	defer close(c.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, proto.MaxPacket)
	oob := make([]byte, proto.OOBSize)
	var fds [proto.MaxFDs]int
	var ev proto.Evict
	for {
		pkt, nfds, err := proto.Recv(c.conn, buf, oob, fds[:])
		for _, fd := range fds[:nfds] {
			unix.Close(fd)
		}
		if err != nil {
			if c.isClosed() {
				c.fail(ErrClosed)
				return
			}
			// The agent went away: requests in flight fail, the memory
			// stays; a next agent resumes us, or our faults end in
			// SIGBUS after proto.AgentWait (resume.go).
			c.fail(fmt.Errorf("client: lost the agent: %w", err))
			if err := c.resume(); err != nil {
				c.fail(err)
				return
			}
			continue
		}
		h, body, err := proto.Parse(pkt)
		if err != nil {
			c.fail(err)
			return
		}
		switch h.Type {
		case proto.TypeAck:
			var m proto.Ack
			if err := m.Decode(body); err == nil {
				c.answer(m.Seq, nil)
			}
		case proto.TypeError:
			var m proto.Error
			if err := m.Decode(body); err == nil {
				c.answer(m.Seq, &m)
			}
		case proto.TypeEvict:
			if err := ev.Decode(body); err != nil {
				c.fail(err)
				return
			}
			done, errno := c.evict(&ev)
			c.send(0, &proto.Evicted{Batch: ev.Batch, Done: done, Errno: errno})
		}
	}
}

// evict copies each victim to its staging slot (unless it has none: the
// pool holds it, or nothing is mapped there) and drops it. The agent has
// write-protected the pages, so they cannot change meanwhile.
//
// Each run of adjacent victims is dropped with one madvise.
func (c *Client) evict(ev *proto.Evict) (uint32, unix.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pages := ev.Pages[:ev.N]
	for i, p := range pages {
		r, off := c.regionAt(uintptr(p.Addr))
		if r == nil {
			return c.drop(pages[:i]), unix.EFAULT
		}
		if p.Slot == proto.NoSlot {
			continue
		}
		if (int(p.Slot)+1)*pageSize > len(c.staging) {
			return c.drop(pages[:i]), unix.EINVAL
		}
		if err := copyOut(c.staging[int(p.Slot)*pageSize:(int(p.Slot)+1)*pageSize], r, off); err != nil {
			return c.drop(pages[:i]), unix.EIO
		}
	}
	done := c.drop(pages)
	if done < uint32(len(pages)) {
		return done, unix.EINVAL
	}
	return done, 0
}

// copyOut copies the page at offset off of region r into dst. A shared
// region's page is read from its file, not through the mapping: a process
// may have punched it (MADV_REMOVE, fallocate) or truncated the file
// meanwhile, and the mapping would then fault, on this thread, to the
// agent that pages it and waits for this eviction; the file reads a hole
// as zeros, and a page past its end as nothing (zeros here).
func copyOut(dst []byte, r *region, off uintptr) error {
	if r.file == nil {
		copy(dst, r.mem[off:off+pageSize])
		return nil
	}
	n, err := unix.Pread(int(r.file.Fd()), dst, int64(off))
	for err == unix.EINTR {
		n, err = unix.Pread(int(r.file.Fd()), dst, int64(off))
	}
	if err != nil {
		return err
	}
	clear(dst[n:])
	return nil
}

// drop madvises the copied pages away, a run of adjacent pages at a time,
// and returns how many of them (from the first) were dropped.
// Preconditions: c.mu held.
func (c *Client) drop(pages []proto.EvictPage) uint32 {
	for i := 0; i < len(pages); {
		j := i + 1
		for j < len(pages) && pages[j].Addr == pages[j-1].Addr+pageSize {
			j++
		}
		first, last := c.page(uintptr(pages[i].Addr)), c.page(uintptr(pages[j-1].Addr))
		if first == nil || last == nil || uintptr(userfaultfd.AddrOf(last))-uintptr(userfaultfd.AddrOf(first)) != uintptr(j-1-i)*pageSize {
			return uint32(i) // not one mapping: the agent's addresses are wrong
		}
		run := extend(first, (j-i)*pageSize)
		if run == nil || unix.Madvise(run, c.dropAdvice(uintptr(pages[i].Addr))) != nil {
			return uint32(i)
		}
		i = j
	}
	return uint32(len(pages))
}

// dropAdvice is how a page at a is dropped: MADV_REMOVE for a shared
// region (the page leaves the file, so that it is a hole for every
// mapping), MADV_DONTNEED for private memory. Preconditions: c.mu held.
func (c *Client) dropAdvice(a uintptr) int {
	for start, r := range c.regions {
		if a >= start && a < start+uintptr(len(r.mem)) && r.shared {
			return unix.MADV_REMOVE
		}
	}
	return unix.MADV_DONTNEED
}

// extend returns n bytes of the region that first starts, or nil when
// they are not all inside it.
// Preconditions: c.mu held.
func extend(first []byte, n int) []byte {
	if n <= cap(first) {
		return first[:n:n]
	}
	return nil
}

// page returns the mapped page at a, or nil. Preconditions: c.mu held.
func (c *Client) page(a uintptr) []byte {
	r, off := c.regionAt(a)
	if r == nil {
		return nil
	}
	return r.mem[off : off+pageSize] // cap: to the region's end
}

// regionAt returns the region that holds page a, and a's offset in it;
// nil if none does or a is not page aligned. Preconditions: c.mu held.
func (c *Client) regionAt(a uintptr) (*region, uintptr) {
	if a%pageSize != 0 {
		return nil, 0
	}
	for start, r := range c.regions {
		if a >= start && a < start+uintptr(len(r.mem)) {
			return r, a - start
		}
	}
	return nil, 0
}

func (c *Client) answer(seq uint32, err error) {
	c.mu.Lock()
	ch := c.waiters[seq]
	delete(c.waiters, seq)
	c.mu.Unlock()
	if ch != nil {
		ch <- err
	}
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	ws := c.waiters
	c.waiters = map[uint32]chan error{}
	c.mu.Unlock()
	for _, ch := range ws {
		ch <- err
	}
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close unmaps every region, disconnects and closes the uffd. Safe to
// call twice.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	regs := make([]*region, 0, len(c.regions))
	for _, r := range c.regions {
		regs = append(regs, r)
	}
	c.mu.Unlock()
	for _, r := range regs {
		c.Unmap(r.mem)
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.sendMu.Lock()
	c.conn.Close()
	c.sendMu.Unlock()
	<-c.done
	unix.Munmap(c.staging)
	if c.stagingFD >= 0 {
		unix.Close(c.stagingFD)
	}
	return c.uffd.Close()
}

var (
	defaultMu sync.Mutex
	defaultC  *Client
)

// Default returns the process's client of the agent at proto.SocketPath(),
// connecting on first use.
func Default() (*Client, error) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultC == nil {
		c, err := Connect("")
		if err != nil {
			return nil, err
		}
		defaultC = c
	}
	return defaultC, nil
}

// Map maps size bytes with the default client.
func Map(size int) ([]byte, error) {
	c, err := Default()
	if err != nil {
		return nil, err
	}
	return c.Map(size)
}

// Unmap unmaps memory returned by Map.
func Unmap(b []byte) error {
	c, err := Default()
	if err != nil {
		return err
	}
	return c.Unmap(b)
}
