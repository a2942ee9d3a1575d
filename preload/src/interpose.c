/* mmap, munmap, mremap, madvise, mprotect and sbrk: how memory that does
 * not come from our heap becomes, changes and stops being a region. This
 * is where a foreign allocator's memory (jemalloc's extents, tcmalloc's
 * spans, mimalloc's segments, CPython's arenas, a static allocator's) is
 * paged, and jemalloc's own calls (heap.c) share these paths. Everything
 * here may run inside another allocator's mmap call holding its locks:
 * nothing allocates.
 *
 * Which mappings become regions: MAP_PRIVATE|MAP_ANONYMOUS ones of
 * min-alloc bytes up to MAX_REGION_LEN, any protection (a PROT_NONE
 * reservation too: its registration survives a later mprotect, measured
 * on 6.18), MAP_NORESERVE allowed. Not MAP_SHARED (paging it privately
 * would break the sharing), file mappings (the page cache pages them),
 * MAP_POPULATE, MAP_HUGETLB, MAP_GROWSDOWN, MAP_STACK, MAP_LOCKED. */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <stdarg.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int eligible_flags(int flags)
{
	const int refuse = MAP_POPULATE | MAP_HUGETLB | MAP_GROWSDOWN | MAP_STACK | MAP_LOCKED;
	return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE && !(flags & refuse);
}

static int big(size_t len) { return len >= g_min_alloc && len <= MAX_REGION_LEN; }

/* [a, a+len), just mapped with prot, becomes a region of kind (or a
 * pending one, before our constructor). Preconditions: in_shim set. */
static void adopt(uintptr_t a, size_t len, int kind, int prot)
{
	if (!__atomic_load_n(&g_ctor_done, __ATOMIC_ACQUIRE)) {
		pending_add(a, len, kind, prot);
	} else if (connected() && big(len)) { /* the agent's min-alloc may be larger */
		req_lock();
		if (is_connected())
			add_region_locked((void *)a, len, kind, prot); /* refused: ordinary memory */
		req_unlock();
	}
}

/* A MAP_FIXED mapping of [a, a+len) over (part of) regions. If it is
 * eligible and we are connected, the memory stays in the regions: if zap,
 * REGION_ZAP first (its contents are gone: mimalloc decommits with
 * MAP_FIXED PROT_NONE and commits with mprotect, others commit with
 * MAP_FIXED; jemalloc's unmaps in our heap), then the old pieces are
 * unregistered (so that the kernel raises no UNMAP event, which the agent
 * takes as the end of a region it covers whole), mapped over, and
 * registered again. Otherwise (shared, a file, no agent) the range leaves
 * the regions first (punch_locked: REGION_DEL). Returns what mmap returns.
 * Preconditions: req_mu held, in_shim set. */
void *fixed_locked(uintptr_t a, size_t len, int prot, int flags, int fd, off_t off, int zap)
{
	uintptr_t end = a + round_up(len, g_page), lo, hi;
	struct region r;
	if (!eligible_flags(flags) || !is_connected()) {
		int err = punch_locked(a, end - a);
		if (err) {
			errno = -err;
			return MAP_FAILED;
		}
		return raw_mmap((void *)a, len, prot, flags, fd, off);
	}
	if (zap)
		zap_locked(a, end - a);
	for (uintptr_t at = a; next_piece(at, end, &r, &lo, &hi); at = hi) {
		struct uffdio_range rg = {lo, hi - lo};
		ioctl(g_uffd, UFFDIO_UNREGISTER, &rg);
	}
	void *p = raw_mmap((void *)a, len, prot, flags, fd, off);
	int e = errno;
	for (uintptr_t at = a; next_piece(at, end, &r, &lo, &hi);) {
		struct uffdio_register reg = {
			.range = {lo, hi - lo},
			.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
		};
		if (p != MAP_FAILED && ioctl(g_uffd, UFFDIO_REGISTER, &reg) == 0) {
			if (!in_fork) /* see fork.c */
				raw_madvise((void *)lo, hi - lo, MADV_DONTFORK);
			at = hi;
		} else if (punch_locked(lo, hi - lo) != 0) {
			at = hi; /* no room to split: the table keeps it, unregistered */
		}
	}
	if ((prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE) && !in_heap((void *)a))
		table_mark(a, end - a, R_NOTRW);
	errno = e;
	return p;
}

void *mmap_fixed_over_regions(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	in_shim++;
	req_lock();
	void *p = fixed_locked((uintptr_t)addr, len, prot, flags, fd, off, 1);
	req_unlock();
	in_shim--;
	return p;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (in_shim)
		return raw_mmap(addr, len, prot, flags, fd, off);
	enter();
	uintptr_t a = (uintptr_t)addr;
	if ((flags & MAP_FIXED) && page_range(a, len)) {
		pending_drop(a, round_up(len, g_page));
		if (overlaps_regions(a, round_up(len, g_page)))
			return mmap_fixed_over_regions(addr, len, prot, flags, fd, off);
	}
	if (!eligible_flags(flags) || !big(len))
		return raw_mmap(addr, len, prot, flags, fd, off);
	void *p = raw_mmap(addr, len, prot, flags, fd, off);
	if (p == MAP_FAILED)
		return p;
	int e = errno;
	in_shim++;
	adopt((uintptr_t)p, round_up(len, g_page), KIND_MMAP, prot);
	in_shim--;
	errno = e;
	return p;
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((alias("mmap")));

/* While this thread is inside a fork (fork.c: other libraries' atfork
 * handlers run there), the region set is frozen, so that the FORK event
 * and the fork serial agree with what the child inherits: unmapping
 * regions waits here until the fork is done (in the parent, and in the
 * child, which inherits both the region and the entry). */
#define MAX_DEFERRED 32
static struct {
	uintptr_t a;
	size_t len;
} g_deferred[MAX_DEFERRED];
static int g_ndeferred;

int defer_unmap(uintptr_t a, size_t len)
{
	if (g_ndeferred == MAX_DEFERRED)
		return 0;
	g_deferred[g_ndeferred].a = a;
	g_deferred[g_ndeferred].len = len;
	g_ndeferred++;
	return 1;
}

/* Preconditions: req_mu held, not in fork. */
void run_deferred_locked(void)
{
	for (int i = 0; i < g_ndeferred; i++) {
		punch_locked(g_deferred[i].a, g_deferred[i].len);
		raw_munmap((void *)g_deferred[i].a, g_deferred[i].len);
	}
	g_ndeferred = 0;
}

EXPORT int munmap(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	if (in_shim || !page_range(a, len))
		return raw_munmap(addr, len);
	size_t rl = round_up(len, g_page);
	pending_drop(a, rl);
	if (!overlaps_regions(a, rl))
		return raw_munmap(addr, len);
	if (in_fork && defer_unmap(a, rl))
		return 0;
	in_shim++;
	req_lock();
	int err = punch_locked(a, rl);
	req_unlock();
	in_shim--;
	if (err) {
		errno = -err;
		return -1;
	}
	return raw_munmap(addr, len);
}

static int drops_pages(int advice)
{
	switch (advice) {
	case MADV_DONTNEED:
	case MADV_FREE:
#ifdef MADV_DONTNEED_LOCKED
	case MADV_DONTNEED_LOCKED:
#endif
		return 1;
	}
	return 0;
}

/* madvise that drops pages of a region (allocators give memory back this
 * way) is preceded by REGION_ZAP, so that the agent forgets its copies of
 * those pages: they read as zeros from now on. The agent hears first, so
 * that an evicted page never comes back with old contents after madvise
 * returned, and an eviction in flight (whose EVICT the helper finishes
 * before it reads our ACK) never copies a page the kernel just dropped.
 * MADV_FREE is done as MADV_DONTNEED: with FREE the kernel may keep the
 * page mapped while the agent takes it for gone, resident outside the
 * budget for good. MADV_HUGEPAGE is ignored (the agent evicts 4 KiB
 * pages). A raw madvise system call bypasses this: evicted pages it names
 * would come back with their old contents (docs/pager.md). */
int madvise_core(void *addr, size_t len, int advice)
{
	uintptr_t a = (uintptr_t)addr;
	int drop = drops_pages(advice);
	if (in_shim || (!drop && advice != MADV_HUGEPAGE) || !page_range(a, len) ||
	    !overlaps_regions(a, round_up(len, g_page)))
		return raw_madvise(addr, len, advice);
	if (!drop)
		return 0;
	in_shim++;
	req_lock();
	zap_locked(a, round_up(len, g_page));
	req_unlock();
	in_shim--;
	return raw_madvise(addr, len, advice == MADV_FREE ? MADV_DONTNEED : advice);
}

EXPORT int madvise(void *addr, size_t len, int advice) { return madvise_core(addr, len, advice); }

/* mprotect passes through (a registration survives it, and so do the
 * agent's write protections); the regions it touches are marked first
 * (R_UNREADABLE, R_NOTRW) if pages lose access. */
int mprotect_core(void *addr, size_t len, int prot)
{
	uintptr_t a = (uintptr_t)addr;
	if (!in_shim && (prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE) && page_range(a, len))
		table_mark(a, round_up(len, g_page), (prot & PROT_READ) ? R_NOTRW : R_NOTRW | R_UNREADABLE);
	return raw_mprotect(addr, len, prot);
}

EXPORT int mprotect(void *addr, size_t len, int prot) { return mprotect_core(addr, len, prot); }

/* mremap of a region: shrinking in place unmaps the tail; moving or
 * growing (MREMAP_MAYMOVE) copies into a new mapping (the agent never sees
 * a REMAP of a region: docs/pager.md); growing in place fails with ENOMEM
 * (as the kernel does when the neighbour is taken); MREMAP_DONTUNMAP is
 * refused (EINVAL), and so is moving a region with pages that may not be
 * read and written (R_NOTRW: ENOMEM, as when the kernel finds no room):
 * the copy could neither read them nor keep their protection. Other
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
	size_t ol = round_up(oldlen, g_page), nl = round_up(newlen, g_page);
	if (!in_shim && page_range(a, oldlen))
		pending_drop(a, ol);
	if (in_shim || !page_range(a, oldlen) || !newlen || !overlaps_regions(a, ol))
		return (void *)syscall(SYS_mremap, old, oldlen, newlen, flags, want);
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
	int rflags = 0;
	for (uintptr_t at = a; next_piece(at, a + ol, &r, &lo, &hi); at = hi)
		rflags |= r.flags;
	if (!(flags & MREMAP_MAYMOVE) || (rflags & R_NOTRW)) {
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
	if (!real_sbrk)
		enter();
	if (!real_sbrk) {
		errno = ENOSYS;
		return (void *)-1;
	}
	if (in_shim || !inc)
		return real_sbrk(inc);
	enter();
	if (inc < 0) {
		uintptr_t cur = (uintptr_t)real_sbrk(0);
		uintptr_t lo = round_up(cur + (uintptr_t)inc, g_page), hi = round_up(cur, g_page);
		if (hi > lo) {
			pending_drop(lo, hi - lo);
			if (overlaps_regions(lo, hi - lo)) {
				in_shim++;
				req_lock();
				punch_locked(lo, hi - lo);
				req_unlock();
				in_shim--;
			}
		}
		return real_sbrk(inc);
	}
	void *old = real_sbrk(inc);
	if (old == (void *)-1)
		return old;
	uintptr_t lo = round_up((uintptr_t)old, g_page), hi = round_up((uintptr_t)old + (uintptr_t)inc, g_page);
	if (hi > lo && big(hi - lo)) {
		int e = errno;
		in_shim++;
		adopt(lo, hi - lo, KIND_MMAP, PROT_READ | PROT_WRITE);
		in_shim--;
		errno = e;
	}
	return old;
}
