package rdma

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// RegionOptions configure AllocRegion. The zero value gives a plain memfd
// of 4 KiB pages.
type RegionOptions struct {
	// Name is the memfd's name (shows in /proc/PID/fd); default "rmem-region".
	Name string
	// HugeTLB backs the region with 2 MiB hugetlbfs pages (MFD_HUGETLB);
	// size must be a multiple of 2 MiB and the pool must have free pages.
	HugeTLB bool
	// THP asks for transparent huge pages (madvise MADV_HUGEPAGE); it is
	// advice and never fails the allocation.
	THP bool
	// Lock mlocks the region so the kernel never swaps it out.
	Lock bool
}

const hugePage = 2 << 20

// Region is memory a memory server owns and serves: one contiguous mapping,
// normally a MAP_SHARED memfd so the shm provider can share it with clients
// on the same host. It is the unit of Domain.Register (a verbs MR).
type Region struct {
	mem   []byte
	fd    int
	owned bool // mem is our mapping: Close unmaps it

	mu     sync.Mutex
	domain *Domain // guarded by mu; set while registered
	closed bool
}

// AllocRegion creates a memfd of size bytes and maps it shared, read-write.
// size must be a positive multiple of the page size (2 MiB with HugeTLB).
func AllocRegion(size int64, opts RegionOptions) (*Region, error) {
	page := int64(os.Getpagesize())
	if opts.HugeTLB {
		page = hugePage
	}
	if size <= 0 || size%page != 0 {
		return nil, fmt.Errorf("rdma: region size %d is not a positive multiple of %d", size, page)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("rdma: region size %d too large", size)
	}
	name := opts.Name
	if name == "" {
		name = "rmem-region"
	}
	flags := unix.MFD_CLOEXEC
	if opts.HugeTLB {
		flags |= unix.MFD_HUGETLB | unix.MFD_HUGE_2MB
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return nil, fmt.Errorf("rdma: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rdma: ftruncate region to %d: %w", size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rdma: mmap region: %w", err)
	}
	if opts.THP {
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // advice only
	}
	if opts.Lock {
		if err := unix.Mlock(mem); err != nil {
			unix.Munmap(mem)
			unix.Close(fd)
			return nil, fmt.Errorf("rdma: mlock region: %w", err)
		}
	}
	return &Region{mem: mem, fd: fd, owned: true}, nil
}

// NewRegion wraps memory the caller owns (no file descriptor: the shm
// provider cannot share it, tcp and the in-memory provider can). The caller
// keeps mem alive and unchanged in size until the region is deregistered.
func NewRegion(mem []byte) *Region { return &Region{mem: mem, fd: -1} }

// Bytes returns the region's memory. The server may use it (e.g. zero a slab
// after revoking its key); clients of live keys see its writes.
func (r *Region) Bytes() []byte { return r.mem }

// Len returns the region's size in bytes.
func (r *Region) Len() uint64 { return uint64(len(r.mem)) }

// Fd returns the memfd backing the region, or -1. It stays owned by the
// region.
func (r *Region) Fd() int { return r.fd }

// Close unmaps and closes a region made by AllocRegion (for NewRegion it
// only marks it closed). It fails with ErrRegistered while registered.
// It is safe to call twice.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.domain != nil {
		return ErrRegistered
	}
	if r.closed {
		return nil
	}
	r.closed = true
	if !r.owned {
		return nil
	}
	var errs []error
	if err := unix.Munmap(r.mem); err != nil {
		errs = append(errs, fmt.Errorf("rdma: munmap region: %w", err))
	}
	if err := unix.Close(r.fd); err != nil {
		errs = append(errs, fmt.Errorf("rdma: close region fd: %w", err))
	}
	r.mem, r.fd = nil, -1
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}
