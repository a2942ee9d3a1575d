/* mmap, munmap, mremap, madvise, mprotect and sbrk: how memory that does
 * not come from our heap becomes, changes and stops being a region. This
 * is where a foreign allocator's memory (jemalloc's extents, tcmalloc's
 * spans, mimalloc's segments, CPython's arenas, a static allocator's) is
 * paged; what they do to regions is region.c's, which jemalloc's own
 * calls (heap.c) share. Everything here may run inside another
 * allocator's mmap call holding its locks: nothing allocates.
 *
 * Which mappings become regions: MAP_PRIVATE|MAP_ANONYMOUS ones of
 * min-alloc bytes up to MAX_REGION_LEN, any protection (a PROT_NONE
 * reservation too: its registration survives a later mprotect, measured
 * on 6.18), MAP_NORESERVE allowed (kind mmap). And every MAP_SHARED (or
 * MAP_SHARED_VALIDATE) mapping of shared memory whose segment is of those
 * sizes, kind shared: MAP_ANONYMOUS ones of min-alloc bytes or more, and
 * any mapping (any length, protection or address, MAP_FIXED too) of a
 * file on shmem (tmpfs: /dev/shm and shm_open, memfd_create; not
 * hugetlbfs) of min-alloc bytes or more: the agent pages their pages once
 * per segment, for every process that maps it (rmem.h's enum kind says
 * what the shim does differently for them). Every mapping of a segment
 * the agent pages must be one of its proxies, or it would read the
 * evicted pages as holes: one the shim cannot register (a file opened
 * read-only: the kernel registers VM_MAYWRITE mappings only), or
 * MAP_LOCKED, is announced unpaged (RMEM_REGION_UNPAGED), and the agent
 * stops paging the segment. MAP_POPULATE is done after the registration
 * (MADV_POPULATE_READ): the agent serves its faults. Not other file
 * mappings (the page cache pages them), MAP_HUGETLB, MAP_GROWSDOWN,
 * MAP_STACK, private MAP_POPULATE or MAP_LOCKED. (SysV shm is attached
 * with shmat, not mmap: not seen.) */
#include "rmem.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int big(size_t len) { return len >= rm_min_alloc() && len <= MAX_REGION_LEN; }

/* [a, a+len), just mapped with prot, becomes a region of kind (or a
 * pending one, before our constructor) if size, the mapping's or its
 * shared memory segment's, is big enough for the agent, whose min-alloc
 * may be larger. Preconditions: in_shim set. */
static void adopt(uintptr_t a, size_t len, int kind, int prot, size_t size)
{
	if (rm_region_early()) {
		rm_pending_add(a, len, kind, prot);
	} else if (rm_connected() && big(size)) {
		rm_req_lock();
		if (rm_conn_is_connected())
			rm_region_add_locked((void *)a, len, kind, prot); /* refused: ordinary memory */
		rm_req_unlock();
	}
}

/* [a, a+len), just mapped with flags, of a shared memory segment of seg
 * bytes, becomes a region of kind shared (adopt), or is announced
 * unpaged. Preconditions: in_shim set. */
static void adopt_shared(uintptr_t a, size_t len, int prot, int flags, size_t seg)
{
	if (!big(seg))
		return;
	if (len <= MAX_REGION_LEN && !(flags & MAP_LOCKED)) {
		adopt(a, len, KIND_SHARED, prot, seg);
	} else if (!rm_region_early() && rm_connected()) {
		rm_req_lock();
		if (rm_conn_is_connected())
			rm_region_unpaged_locked(a, len);
		rm_req_unlock();
	}
}

/* Whether a mapping of [addr, addr+len) with flags is MAP_FIXED over
 * regions (rm_map_fixed's), dropping pending regions there. */
static int fixed_over_regions(void *addr, size_t len, int flags)
{
	uintptr_t a = (uintptr_t)addr;
	if (!(flags & MAP_FIXED) || !page_range(a, len))
		return 0;
	rm_region_pending_drop(a, round_up(len, rm_page));
	return rm_table_overlaps(a, round_up(len, rm_page));
}

static int fixed_how(void *addr) { return RM_FIXED_ZAP | (in_heap(addr) ? RM_FIXED_HEAP : 0); }

/* mmap of shared memory (a segment of seg bytes): any mapping of a segment
 * the agent may page is announced (this file's head says why). */
static void *map_shared(void *addr, size_t len, int prot, int flags, int fd, off_t off, size_t seg)
{
	int populate = flags & MAP_POPULATE;
	flags &= ~MAP_POPULATE;
	void *p = fixed_over_regions(addr, len, flags) ? rm_map_fixed(addr, len, prot, flags, fd, off, fixed_how(addr))
						       : rm_raw_mmap(addr, len, prot, flags, fd, off);
	if (p == MAP_FAILED)
		return p;
	int e = errno;
	rm_shim_enter();
	adopt_shared((uintptr_t)p, round_up(len, rm_page), prot, flags, seg);
	rm_shim_leave();
	if (fd >= 0 && big(seg))
		rm_watch_fd(fd);
	if (populate)
		rm_raw_madvise(p, len, MADV_POPULATE_READ); /* best effort, as MAP_POPULATE */
	errno = e;
	return p;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (rm_in_shim())
		return rm_raw_mmap(addr, len, prot, flags, fd, off);
	rm_enter();
	size_t seg;
	if (rm_shared_memory(flags, fd, len, &seg))
		return map_shared(addr, len, prot, flags, fd, off, seg);
	if (fixed_over_regions(addr, len, flags))
		return rm_map_fixed(addr, len, prot, flags, fd, off, fixed_how(addr));
	if (!big(len) || !rm_region_eligible(flags))
		return rm_raw_mmap(addr, len, prot, flags, fd, off);
	void *p = rm_raw_mmap(addr, len, prot, flags, fd, off);
	if (p == MAP_FAILED)
		return p;
	int e = errno;
	rm_shim_enter();
	adopt((uintptr_t)p, round_up(len, rm_page), KIND_MMAP, prot, len);
	rm_shim_leave();
	errno = e;
	return p;
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((alias("mmap")));

EXPORT int munmap(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	if (rm_in_shim() || !page_range(a, len))
		return rm_raw_munmap(addr, len);
	size_t rl = round_up(len, rm_page);
	rm_region_pending_drop(a, rl);
	if (!rm_table_overlaps(a, rl))
		return rm_raw_munmap(addr, len);
	if (rm_in_fork() && rm_defer_unmap(a, rl))
		return 0;
	rm_shim_enter();
	rm_req_lock();
	int err = rm_region_punch_locked(a, rl);
	rm_req_unlock();
	rm_shim_leave();
	if (err) {
		errno = -err;
		return -1;
	}
	return rm_raw_munmap(addr, len);
}

/* madvise and mprotect: region.c's (jemalloc's go there too). */
EXPORT int madvise(void *addr, size_t len, int advice) { return rm_madvise(addr, len, advice); }

EXPORT int mprotect(void *addr, size_t len, int prot) { return rm_mprotect(addr, len, prot); }

/* mremap of a region: shrinking in place unmaps the tail; moving or
 * growing (MREMAP_MAYMOVE) copies into a new mapping (the agent never sees
 * a REMAP of a region: docs/pager.md); growing in place fails with ENOMEM
 * (as the kernel does when the neighbour is taken); MREMAP_DONTUNMAP is
 * refused (EINVAL), and so is moving a region with pages that may not be
 * read and written (R_NOTRW: ENOMEM, as when the kernel finds no room):
 * the copy could neither read them nor keep their protection. A range
 * that overlaps a shared region (KIND_SHARED) is not moved or grown
 * either (ENOMEM, as when the kernel finds no room): a copy into private
 * anonymous memory would leave the segment, and the sharing with it. Other
 * mappings go to the kernel. */
EXPORT void *mremap(void *old, size_t oldlen, size_t newlen, int flags, ...)
{
	void *want = NULL;
	if (flags & MREMAP_FIXED) {
		va_list ap;
		va_start(ap, flags);
		want = va_arg(ap, void *);
		va_end(ap);
	}
	uintptr_t a = (uintptr_t)old;
	size_t ol = round_up(oldlen, rm_page), nl = round_up(newlen, rm_page);
	if (!rm_in_shim() && page_range(a, oldlen))
		rm_region_pending_drop(a, ol);
	if (rm_in_shim() || !page_range(a, oldlen) || !newlen || !rm_table_overlaps(a, ol))
		return (void *)rm_sysret(rm_sys6(SYS_mremap, (long)old, (long)oldlen, (long)newlen, flags, (long)want, 0));
	if (flags & MREMAP_DONTUNMAP) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	if (nl <= ol && !(flags & MREMAP_FIXED)) {
		if (nl < ol && munmap((void *)(a + nl), ol - nl) != 0)
			return MAP_FAILED;
		return old;
	}
	struct region r;
	uintptr_t lo, hi;
	int rflags = 0, shared = 0;
	for (uintptr_t at = a; rm_table_next_piece(at, a + ol, &r, &lo, &hi); at = hi) {
		rflags |= r.flags;
		shared |= r.kind == KIND_SHARED;
	}
	if (!(flags & MREMAP_MAYMOVE) || (rflags & R_NOTRW) || shared) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	void *q = (flags & MREMAP_FIXED)
			  ? mmap(want, newlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
			  : mmap(NULL, newlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED)
		return MAP_FAILED;
	memcpy(q, old, oldlen < newlen ? oldlen : newlen);
	munmap(old, oldlen);
	return q;
}

/* sbrk: tcmalloc tries it before mmap. New heap pages of min-alloc bytes
 * or more become a region; a negative increment is a REGION_DEL of the
 * tail first. (brk is not interposable inside glibc; glibc mode uses
 * glibc's heap for the shim's own allocations only.) */
EXPORT void *sbrk(intptr_t inc)
{
	rm_sbrk_fn *real_sbrk = rm_real_sbrk();
	if (!real_sbrk) {
		rm_enter();
		real_sbrk = rm_real_sbrk();
	}
	if (!real_sbrk) {
		errno = ENOSYS;
		return (void *)-1;
	}
	if (rm_in_shim() || !inc)
		return real_sbrk(inc);
	rm_enter();
	if (inc < 0) {
		uintptr_t cur = (uintptr_t)real_sbrk(0);
		uintptr_t lo = round_up(cur + (uintptr_t)inc, rm_page), hi = round_up(cur, rm_page);
		if (hi > lo) {
			rm_region_pending_drop(lo, hi - lo);
			if (rm_table_overlaps(lo, hi - lo)) {
				rm_shim_enter();
				rm_req_lock();
				rm_region_punch_locked(lo, hi - lo);
				rm_req_unlock();
				rm_shim_leave();
			}
		}
		return real_sbrk(inc);
	}
	void *old = real_sbrk(inc);
	if (old == (void *)-1)
		return old;
	uintptr_t lo = round_up((uintptr_t)old, rm_page), hi = round_up((uintptr_t)old + (uintptr_t)inc, rm_page);
	if (hi > lo && big(hi - lo)) {
		int e = errno;
		rm_shim_enter();
		adopt(lo, hi - lo, KIND_MMAP, PROT_READ | PROT_WRITE, hi - lo);
		rm_shim_leave();
		errno = e;
	}
	return old;
}
