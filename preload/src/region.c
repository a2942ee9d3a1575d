/* How memory becomes, changes and stops being a region, for the files
 * above (interpose.c's system calls, heap.c's heap, fork.c): connecting on
 * first use, the requests that change the table (REGION_ADD, REGION_DEL,
 * REGION_ZAP: the agent hears first, then the table changes, table.c),
 * MAP_FIXED over regions, madvise and mprotect of regions, the pending
 * ranges' registration, and the unmaps a fork defers. Everything here may
 * run inside another allocator's mmap call holding its locks: nothing
 * allocates. */
#include "rmem.h"

#include <errno.h>
#include <linux/magic.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>

static int g_open;            /* our constructor ran (atomic): new memory may connect */
static uint64_t g_next_id = 1; /* req_mu */
static int g_full_said;
static int g_sigbus_said;

/* Called by our constructor once the helper thread exists (or could not
 * be created): from now on new memory connects and becomes regions, and
 * what came before (pending) is registered. Preconditions: in_shim set. */
void rm_region_open(void)
{
	__atomic_store_n(&g_open, 1, __ATOMIC_RELEASE);
	if (rm_pending_count())
		rm_connected();
}

/* Whether our constructor has not run yet: new memory is pending. */
int rm_region_early(void) { return !__atomic_load_n(&g_open, __ATOMIC_ACQUIRE); }

/* Registers the pending ranges. Preconditions: connected, req_mu not
 * held, in_shim set. */
static void pending_register(void)
{
	if (!rm_pending_count())
		return;
	rm_req_lock();
	uintptr_t a;
	size_t len;
	int kind, prot;
	while (rm_pending_pop(&a, &len, &kind, &prot))
		if (kind > 0 && rm_conn_is_connected())
			rm_region_add_locked((void *)a, len, kind, prot);
	rm_req_unlock();
}

/* Whether new memory can go to the agent, connecting on first use (then
 * registering the pending ranges). Not inside a fork (fork.c holds
 * init_mu, and the region set is frozen there), nor before our
 * constructor created the helper thread. Preconditions: in_shim set,
 * req_mu not held. */
int rm_connected(void)
{
	if (rm_in_fork())
		return 0;
	if (rm_conn_state() != ST_UNINIT)
		return rm_conn_is_connected();
	if (rm_region_early() || !rm_helper_running())
		return 0;
	/* Ring mode: our SIGBUS handler before the uffd that raises SIGBUS
	 * exists (and stays if the agent refuses: it hands every SIGBUS to
	 * the program's own disposition then). */
	if (rm_in_thread && rm_sigbus_install() != 0) {
		if (!__atomic_exchange_n(&g_sigbus_said, 1, __ATOMIC_ACQ_REL))
			rm_say("rmem: cannot install the SIGBUS handler " RMEM_ENV_IN_THREAD " needs: using ordinary memory",
			       NULL);
		return 0;
	}
	int now, ok = rm_conn_connect(&now); /* opens the uffd once connected */
	if (now) {
		rm_handoff_connected();
		pending_register();
	}
	return ok;
}

/* Drops the pending ranges [a, a+len) overlaps, serialized with
 * pending_register by req_mu, so that a range is never registered after
 * its memory went away. */
void rm_region_pending_drop(uintptr_t a, size_t len)
{
	if (!rm_pending_count())
		return;
	rm_req_lock();
	rm_pending_drop(a, len);
	rm_req_unlock();
}

static int prot_flags(int prot)
{
	return (prot & (PROT_READ | PROT_WRITE)) == (PROT_READ | PROT_WRITE) ? 0 : R_NOTRW;
}

/* Registers [p, p+len) and announces it; on success the region is in the
 * table. prot: how it is mapped. Preconditions: req_mu held, connected. */
int rm_region_add_locked(void *p, size_t len, int kind, int prot)
{
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)p, .len = len},
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
	};
	if (rm_table_full()) {
		if (!__atomic_exchange_n(&g_full_said, 1, __ATOMIC_ACQ_REL))
			rm_say("rmem: region table full: further memory is ordinary memory", NULL);
		if (kind == KIND_SHARED)
			rm_region_unpaged_locked((uintptr_t)p, len);
		return -ENOSPC;
	}
	int uffd = rm_conn_uffd();
	if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
		int err = -errno;
		if (kind == KIND_SHARED) /* a file opened read-only: not VM_MAYWRITE */
			rm_region_unpaged_locked((uintptr_t)p, len);
		return err;
	}
	rm_raw_madvise(p, len, MADV_DONTFORK); /* see fork.c */
	struct region r = {(uintptr_t)p, len, g_next_id++, kind, prot_flags(prot)};
	struct rmem_region_add m = {r.id, r.base, r.len, (uint32_t)kind, 0};
	int err = rm_request_locked(RMEM_REGION_ADD, &m, sizeof m);
	if (err) {
		ioctl(uffd, UFFDIO_UNREGISTER, &reg.range);
		rm_raw_madvise(p, len, MADV_DOFORK);
		return err;
	}
	rm_table_insert(&r);
	return 0;
}

/* Announces [a, a+len), a mapping of shared memory that is no region, as
 * unpaged (RMEM_REGION_UNPAGED): the agent stops paging its segment if it
 * does (its evicted pages would read as holes here), and refuses it.
 * Preconditions: req_mu held, connected. */
void rm_region_unpaged_locked(uintptr_t a, size_t len)
{
	struct rmem_region_add m = {0, a, len, KIND_SHARED, RMEM_REGION_UNPAGED};
	rm_request_locked(RMEM_REGION_ADD, &m, sizeof m); /* refused, as asked */
}

/* Takes [a, a+len) out of every region it overlaps: REGION_DEL for each
 * piece, unregistered, then the table update. The caller unmaps or maps
 * over it afterwards: without a registration the kernel raises no UNMAP
 * event, which would block the unmapping thread until an agent read it
 * (forever once the agent is gone). Returns 0 or -ENOMEM if a split does
 * not fit in the table (nothing is changed then).
 * Preconditions: req_mu held; a and len page aligned. */
int rm_region_punch_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len;
	for (;;) {
		struct region r;
		uintptr_t lo, hi;
		if (!rm_table_next_piece(a, end, &r, &lo, &hi))
			return 0;
		if (lo > r.base && hi < r.base + r.len && rm_table_full())
			return -ENOMEM;

		if (rm_conn_is_connected()) {
			struct rmem_region_del m = {r.id, lo, hi - lo};
			int err = rm_request_locked(RMEM_REGION_DEL, &m, sizeof m);
			if (err && err != -EPIPE)
				rm_say("rmem: agent refused REGION_DEL (", rm_errstr(-err), "): unmapping anyway", NULL);
		}
		struct uffdio_range rg = {lo, hi - lo};
		int uffd = rm_conn_uffd();
		if (uffd >= 0)
			ioctl(uffd, UFFDIO_UNREGISTER, &rg);
		rm_table_cut(lo, hi);
	}
}

/* Tells the agent that [a, a+len) is being dropped (it reads as zeros from
 * now on): REGION_ZAP for each piece of a region it overlaps (callers that
 * tell the kinds apart call it piece by piece).
 * Preconditions: req_mu held; a and len page aligned. */
static void zap_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len, at = a;
	struct region r;
	uintptr_t lo, hi;
	/* Without an agent hearing it, a page it journaled in the pool would
	 * come back with its old contents after the drop: wait for the next
	 * one (bounded: resume.c). */
	rm_conn_wait_resumed();
	while (rm_conn_is_connected() && rm_table_next_piece(at, end, &r, &lo, &hi)) {
		struct rmem_region_del m = {r.id, lo, hi - lo};
		int err = rm_request_locked(RMEM_REGION_ZAP, &m, sizeof m);
		if (err && err != -EPIPE)
			rm_say("rmem: agent refused REGION_ZAP (", rm_errstr(-err), ")", NULL);
		at = hi;
	}
}

/* Whether a mapping with these flags may be a region of private memory
 * (interpose.c says which and why). */
int rm_region_eligible(int flags)
{
	const int refuse = MAP_POPULATE | MAP_HUGETLB | MAP_GROWSDOWN | MAP_STACK | MAP_LOCKED;
	return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE && !(flags & refuse);
}

/* Whether a mapping of len bytes of fd with these flags is of shared
 * memory (interpose.c says which is paged and why): MAP_SHARED or
 * MAP_SHARED_VALIDATE, not MAP_HUGETLB, MAP_GROWSDOWN or MAP_STACK, and
 * MAP_ANONYMOUS (a new segment of len bytes) or a file on shmem (f_type
 * TMPFS_MAGIC: /dev/shm, memfd_create; not hugetlbfs), whose size is the
 * segment's. *seg gets the segment's size. The file is asked with raw
 * fstatfs and fstat: this runs inside other allocators' mmap calls. */
int rm_shared_memory(int flags, int fd, size_t len, size_t *seg)
{
	const int refuse = MAP_HUGETLB | MAP_GROWSDOWN | MAP_STACK;
	int type = flags & MAP_TYPE;
	if ((type != MAP_SHARED && type != MAP_SHARED_VALIDATE) || (flags & refuse))
		return 0;
	if (flags & MAP_ANONYMOUS) {
		*seg = len;
		return 1;
	}
	struct statfs fs;
	struct stat st;
	if (fd < 0 || rm_sys(SYS_fstatfs, fd, &fs, 0) != 0 || fs.f_type != TMPFS_MAGIC ||
	    rm_sys(SYS_fstat, fd, &st, 0) != 0)
		return 0;
	*seg = (size_t)st.st_size;
	return 1;
}

/* Takes the pieces of shared regions (KIND_SHARED) in [a, a+len) out of
 * them, as rm_region_punch_locked does: REGION_DEL (this process no longer
 * maps them), never REGION_ZAP, which would have the agent forget the
 * segment's pages for every process that maps it. Returns 0 or -ENOMEM.
 * Preconditions: req_mu held; a and len page aligned. */
static int punch_shared_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len, lo, hi;
	struct region r;
	for (uintptr_t at = a; rm_table_next_piece(at, end, &r, &lo, &hi); at = hi) {
		if (r.kind != KIND_SHARED)
			continue;
		int err = rm_region_punch_locked(lo, hi - lo);
		if (err)
			return err;
	}
	return 0;
}

/* Whether [a, a+len) overlaps a shared region. Preconditions: req_mu
 * held (the answer holds while it is). */
static int overlaps_shared(uintptr_t a, size_t len)
{
	uintptr_t end = a + len, lo, hi;
	struct region r;
	for (uintptr_t at = a; rm_table_next_piece(at, end, &r, &lo, &hi); at = hi)
		if (r.kind == KIND_SHARED)
			return 1;
	return 0;
}

/* A MAP_FIXED mapping of [a, a+len) over (part of) regions. The pieces of
 * shared regions leave them first (REGION_DEL, unregistered: the new
 * mapping is not the segment's, and never joins a shared region; a
 * REGION_ZAP would have the agent forget the segment's pages for every
 * process that maps it). For the pieces of private regions: if the new
 * mapping is eligible private memory and we are connected, the memory
 * stays in the regions: with RM_FIXED_ZAP, REGION_ZAP first (its contents
 * are gone: mimalloc decommits with MAP_FIXED PROT_NONE and commits with
 * mprotect, others commit with MAP_FIXED; jemalloc's unmaps in our heap),
 * then the old pieces are unregistered (so that the kernel raises no UNMAP
 * event, which the agent takes as the end of a region it covers whole),
 * mapped over, and registered again. Otherwise (shared, a file, no agent)
 * the range leaves the regions first (REGION_DEL). Returns what mmap
 * returns. Preconditions: req_mu held, in_shim set. */
void *rm_map_fixed_locked(uintptr_t a, size_t len, int prot, int flags, int fd, off_t off, int how)
{
	uintptr_t end = a + round_up(len, rm_page), lo, hi;
	struct region r;
	int err = punch_shared_locked(a, end - a);
	if (err) {
		errno = -err;
		return MAP_FAILED;
	}
	if (!rm_region_eligible(flags) || !rm_conn_is_connected()) {
		err = rm_region_punch_locked(a, end - a);
		if (err) {
			errno = -err;
			return MAP_FAILED;
		}
		return rm_raw_mmap((void *)a, len, prot, flags, fd, off);
	}
	if (how & RM_FIXED_ZAP)
		zap_locked(a, end - a);
	int uffd = rm_conn_uffd();
	for (uintptr_t at = a; rm_table_next_piece(at, end, &r, &lo, &hi); at = hi) {
		struct uffdio_range rg = {lo, hi - lo};
		ioctl(uffd, UFFDIO_UNREGISTER, &rg);
	}
	void *p = rm_raw_mmap((void *)a, len, prot, flags, fd, off);
	int e = errno;
	for (uintptr_t at = a; rm_table_next_piece(at, end, &r, &lo, &hi);) {
		struct uffdio_register reg = {
			.range = {lo, hi - lo},
			.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
		};
		if (p != MAP_FAILED && ioctl(uffd, UFFDIO_REGISTER, &reg) == 0) {
			if (!rm_in_fork()) /* see fork.c */
				rm_raw_madvise((void *)lo, hi - lo, MADV_DONTFORK);
			at = hi;
		} else if (rm_region_punch_locked(lo, hi - lo) != 0) {
			at = hi; /* no room to split: the table keeps it, unregistered */
		}
	}
	if ((prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE) && !(how & RM_FIXED_HEAP))
		rm_table_mark(a, end - a, R_NOTRW);
	errno = e;
	return p;
}

/* rm_map_fixed_locked, taking req_mu. */
void *rm_map_fixed(void *addr, size_t len, int prot, int flags, int fd, off_t off, int how)
{
	rm_shim_enter();
	rm_req_lock();
	void *p = rm_map_fixed_locked((uintptr_t)addr, len, prot, flags, fd, off, how);
	rm_req_unlock();
	rm_shim_leave();
	return p;
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

/* madvise of [a, end), which overlaps a shared region, piece by piece in
 * address order (as the kernel walks the vmas: it stops at the first
 * error, and goes on past unmapped holes, ENOMEM at the end): a shared
 * region's piece with REGION_ZAP first for MADV_REMOVE (the file's pages
 * are punched: the agent forgets its copies), and advice as it is; a
 * private region's piece as rm_madvise does it for drops (REGION_ZAP, FREE
 * as DONTNEED; MADV_REMOVE, which the kernel refuses there, as it is);
 * memory in no region as it is. Returns what madvise returns.
 * Preconditions: req_mu held, in_shim set. */
static int advise_pieces_locked(uintptr_t a, uintptr_t end, int advice)
{
	int holes = 0;
	for (uintptr_t at = a; at < end;) {
		struct region r;
		uintptr_t lo, hi, stop;
		int adv = advice, zap = 0;
		if (!rm_table_next_piece(at, end, &r, &lo, &hi))
			lo = hi = end;
		if (at < lo) {
			stop = lo; /* in no region */
		} else if (r.kind == KIND_SHARED) {
			stop = hi;
			zap = advice == MADV_REMOVE;
		} else {
			stop = hi;
			zap = advice != MADV_REMOVE;
			adv = advice == MADV_FREE ? MADV_DONTNEED : advice;
		}
		if (zap)
			zap_locked(at, stop - at);
		if (rm_raw_madvise((void *)at, stop - at, adv) != 0) {
			if (errno != ENOMEM)
				return -1;
			holes = 1;
		}
		at = stop;
	}
	if (holes) {
		errno = ENOMEM;
		return -1;
	}
	return 0;
}

/* madvise that drops pages of a private region (allocators give memory
 * back this way) is preceded by REGION_ZAP, so that the agent forgets its
 * copies of those pages: they read as zeros from now on. The agent hears
 * first, so that an evicted page never comes back with old contents after
 * madvise returned, and an eviction in flight (whose EVICT the helper
 * finishes before it reads our ACK) never copies a page the kernel just
 * dropped. MADV_FREE is done as MADV_DONTNEED: with FREE the kernel may
 * keep the page mapped while the agent takes it for gone, resident outside
 * the budget for good. MADV_HUGEPAGE is ignored (the agent evicts 4 KiB
 * pages). A raw madvise system call bypasses this: evicted pages it names
 * would come back with their old contents (docs/pager.md).
 *
 * A shared region's pages are the segment's: MADV_DONTNEED, MADV_FREE and
 * MADV_DONTNEED_LOCKED drop only this process's page table entries (the
 * data stays in the file), so they go to the kernel as they are, with no
 * REGION_ZAP (MADV_FREE fails there with EINVAL, as without the shim);
 * MADV_REMOVE punches the file's pages, so it is preceded by REGION_ZAP of
 * the shared pieces. A range with shared pieces goes piece by piece
 * (advise_pieces_locked); one without them as before. */
int rm_madvise(void *addr, size_t len, int advice)
{
	uintptr_t a = (uintptr_t)addr;
	int drop = drops_pages(advice);
	if (rm_in_shim() || (!drop && advice != MADV_HUGEPAGE && advice != MADV_REMOVE) || !page_range(a, len) ||
	    !rm_table_overlaps(a, round_up(len, rm_page)))
		return rm_raw_madvise(addr, len, advice);
	if (advice == MADV_HUGEPAGE)
		return 0;
	uintptr_t end = a + round_up(len, rm_page);
	rm_shim_enter();
	rm_req_lock();
	if (overlaps_shared(a, end - a)) {
		int r = advise_pieces_locked(a, end, advice), e = errno;
		rm_req_unlock();
		rm_shim_leave();
		errno = e;
		return r;
	}
	if (drop) /* (MADV_REMOVE of private regions: the kernel refuses it) */
		zap_locked(a, end - a);
	rm_req_unlock();
	rm_shim_leave();
	return rm_raw_madvise(addr, len, advice == MADV_FREE ? MADV_DONTNEED : advice);
}

/* mprotect passes through (a registration survives it, and so do the
 * agent's write protections); the regions it touches are marked first
 * (R_UNREADABLE, R_NOTRW) if pages lose access. */
int rm_mprotect(void *addr, size_t len, int prot)
{
	uintptr_t a = (uintptr_t)addr;
	if (!rm_in_shim() && (prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE) && page_range(a, len))
		rm_table_mark(a, round_up(len, rm_page), (prot & PROT_READ) ? R_NOTRW : R_NOTRW | R_UNREADABLE);
	return rm_raw_mprotect(addr, len, prot);
}

/* ---- unmaps deferred across a fork ----
 *
 * While this thread is inside a fork (fork.c: other libraries' atfork
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

/* Returns 1 if [a, a+len) is to be unmapped after the fork, 0 if there is
 * no room (then it is unmapped now). Preconditions: in_fork. */
int rm_defer_unmap(uintptr_t a, size_t len)
{
	if (g_ndeferred == MAX_DEFERRED)
		return 0;
	g_deferred[g_ndeferred].a = a;
	g_deferred[g_ndeferred].len = len;
	g_ndeferred++;
	return 1;
}

/* Preconditions: req_mu held, not in fork. */
void rm_run_deferred_locked(void)
{
	for (int i = 0; i < g_ndeferred; i++) {
		rm_region_punch_locked(g_deferred[i].a, g_deferred[i].len);
		rm_raw_munmap((void *)g_deferred[i].a, g_deferred[i].len);
	}
	g_ndeferred = 0;
}
