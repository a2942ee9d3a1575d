/* glibc mode's heap: the memory of the jemalloc embedded in librmem.so.
 *
 * preload/build.sh links Debian's libjemalloc_pic.a into the shim with its
 * public names renamed (malloc -> rm_je_malloc, ...: jemalloc.syms) and
 * its calls to the system redirected here: mmap, munmap, madvise,
 * mprotect and sbrk (all its memory lives in one reservation, and each
 * chunk it maps is a region), secure_getenv (it reads RMEM_MALLOC_CONF,
 * not the program's MALLOC_CONF, which belongs to the program's own
 * allocator), readlink (no /etc/malloc.conf either), pthread_atfork (fork.c
 * calls its fork handlers where the lock order needs them) and libgcc's
 * unwinder (only its heap profiler, which the shim does not support,
 * unwinds). Its other symbols are hidden: librmem.so exports the shim's
 * own functions only.
 *
 * The reservation: 1 TiB of PROT_NONE, MAP_NORESERVE address space (no
 * memory, no commit charge) taken when the mode is decided, halved on
 * failure down to 1 GiB. jemalloc's chunks are carved from it by a bump
 * pointer at 2 MiB alignment (jemalloc's own alignment, so its mappings
 * are rarely trimmed) and mapped MAP_FIXED; what it unmaps goes back to
 * PROT_NONE, never to the kernel, so that every address in the range is
 * jemalloc's and ownership of a pointer is a range check (alloc.c). With
 * retain:true jemalloc reuses its address space instead of unmapping it,
 * so the bump pointer advances with its peak, not with its churn.
 *
 * The regions are the reservation's 64 MiB segments that hold chunks,
 * whole (their unused part PROT_NONE), not the chunks: jemalloc makes
 * chunks per arena and grows them in steps, a dozen for a small program,
 * and every region costs the agent a slab of its own at least (measured:
 * a 16 MiB heap in 5 chunk regions took 7 more slabs across a fork than
 * in 1 region, pager's TestForkSharesSlabs) and a REGION_ADD round trip.
 * A chunk mapped, and an unmap returned to PROT_NONE, inside a segment
 * keep its registration (region.c's rm_map_fixed_locked). The reservation
 * is this file's: set once, read by in_heap (rmem.h). */
#include "rmem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

uintptr_t rm_heap_base;
size_t rm_heap_len;
static uintptr_t g_bump, g_res_end; /* heap_mu */
static pthread_mutex_t heap_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_full_said;

#define HEAP_ALIGN (2ull << 20)
#define HEAP_SEG (64ull << 20)
#define RES_MAX (1ull << 40)
#define RES_MIN (1ull << 30)

/* The embedded jemalloc's configuration (it reads this symbol, renamed,
 * as its malloc_conf). retain: address space is reused, not unmapped. No
 * background threads: they would be created inside malloc (see helper.c),
 * and purging stays on the allocating threads. No sbrk: all its memory is
 * in the reservation. RMEM_MALLOC_CONF adds to it. */
HIDDEN const char *rm_je_malloc_conf =
	"retain:true,background_thread:false,dss:disabled,abort_conf:false";

int rm_heap_reserve(void)
{
	for (size_t len = RES_MAX; len >= RES_MIN; len /= 2) {
		void *p = rm_raw_mmap(NULL, len + HEAP_SEG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			continue;
		uintptr_t b = round_up((uintptr_t)p, HEAP_SEG);
		g_bump = b;
		g_res_end = b + len;
		rm_heap_base = b;
		__atomic_store_n(&rm_heap_len, len, __ATOMIC_RELEASE);
		return 0;
	}
	rm_say("rmem: cannot reserve address space for the heap: malloc stays glibc's and is not paged", NULL);
	return -1;
}

/* Maps the chunk [a, a+len), fresh (nothing of it was used: no
 * REGION_ZAP), keeping the registration of the segments it lies in, and
 * makes the segments it begins regions (pending before our constructor). */
static void *heap_map(uintptr_t a, size_t len, int prot, int flags)
{
	rm_shim_enter();
	int early = rm_region_early();
	int conn = !early && rm_connected();
	rm_req_lock();
	void *p = rm_map_fixed_locked(a, len, prot, flags | MAP_FIXED, -1, 0, RM_FIXED_HEAP);
	for (uintptr_t s = a & ~(HEAP_SEG - 1); p != MAP_FAILED && s < a + len; s += HEAP_SEG) {
		if (early)
			rm_pending_add(s, HEAP_SEG, KIND_HEAP, PROT_READ | PROT_WRITE);
		else if (conn && rm_conn_is_connected() && !rm_table_overlaps(s, HEAP_SEG))
			rm_region_add_locked((void *)s, HEAP_SEG, KIND_HEAP, PROT_READ | PROT_WRITE); /* refused: ordinary */
	}
	rm_req_unlock();
	rm_shim_leave();
	return p;
}

HIDDEN void *rm_heap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	uintptr_t a = (uintptr_t)addr;
	size_t rl = round_up(len, rm_page);
	if (!rm_heap_len || fd != -1 || !(flags & MAP_ANONYMOUS) || !len || add_overflows(len, rm_page)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	if (flags & MAP_FIXED) { /* a commit or decommit (without overcommit) */
		if (!in_heap(addr) || (a & (rm_page - 1)) || rl > rm_heap_base + rm_heap_len - a) {
			errno = EINVAL;
			return MAP_FAILED;
		}
		return rm_map_fixed(addr, len, prot, flags, fd, off, RM_FIXED_ZAP | RM_FIXED_HEAP);
	}
	rm_lock(&heap_mu);
	uintptr_t at = g_bump;
	if (a) /* a hint: taken if it lies in what is left, else refused */
		at = a >= g_bump && !(a & (rm_page - 1)) && a < g_res_end ? a : 0;
	if (at && rl > g_res_end - at)
		at = 0;
	if (at)
		g_bump = rl + at > g_res_end - HEAP_ALIGN ? g_res_end : round_up(at + rl, HEAP_ALIGN);
	pthread_mutex_unlock(&heap_mu);
	if (!at) {
		if (!a && !__atomic_exchange_n(&g_full_said, 1, __ATOMIC_ACQ_REL))
			rm_say("rmem: the heap's reservation is full: further allocations come from glibc (not paged)", NULL);
		errno = ENOMEM;
		return MAP_FAILED;
	}
	void *p = heap_map(at, rl, prot, flags & ~MAP_FIXED_NOREPLACE);
	if (p == MAP_FAILED) {
		int e = errno; /* keep the range reserved: it is jemalloc's by position */
		rm_raw_mmap((void *)at, rl, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		errno = e;
	}
	return p;
}

HIDDEN int rm_heap_munmap(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	size_t rl = round_up(len, rm_page);
	if (!in_heap(addr) || !page_range(a, len) || rl > rm_heap_base + rm_heap_len - a) {
		errno = EINVAL;
		return -1;
	}
	/* Back to PROT_NONE; its segment stays a region. */
	void *p = rm_map_fixed(addr, rl, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0,
			       RM_FIXED_ZAP | RM_FIXED_HEAP);
	return p == MAP_FAILED ? -1 : 0;
}

HIDDEN int rm_heap_madvise(void *addr, size_t len, int advice) { return rm_madvise(addr, len, advice); }

HIDDEN int rm_heap_mprotect(void *addr, size_t len, int prot) { return rm_mprotect(addr, len, prot); }

HIDDEN void *rm_heap_sbrk(intptr_t inc)
{
	(void)inc;
	errno = ENOMEM;
	return (void *)-1;
}

HIDDEN char *rm_heap_secure_getenv(const char *name)
{
	return secure_getenv(strcmp(name, "MALLOC_CONF") ? name : "RMEM_MALLOC_CONF");
}

HIDDEN ssize_t rm_heap_readlink(const char *path, char *buf, size_t len)
{
	(void)path, (void)buf, (void)len;
	errno = ENOENT;
	return -1;
}

static void (*je_prefork)(void), (*je_postfork_parent)(void), (*je_postfork_child)(void);
static TLS int t_je_forking;

HIDDEN int rm_heap_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void))
{
	je_prefork = prepare;
	je_postfork_parent = parent;
	je_postfork_child = child;
	return 0;
}

/* _Unwind_Backtrace and _Unwind_GetIP: no frames. */
HIDDEN int rm_heap_unwind_backtrace(void *fn, void *arg)
{
	(void)fn, (void)arg;
	return 5; /* _URC_END_OF_STACK */
}

HIDDEN uintptr_t rm_heap_unwind_getip(void *ctx)
{
	(void)ctx;
	return 0;
}

/* jemalloc's fork handlers, around fork(2) (fork.c): its locks are taken
 * after every other library's prepare handler that may allocate. */
void rm_heap_prefork(void)
{
	if (rm_mode() == MODE_GLIBC && je_prefork) {
		je_prefork();
		t_je_forking = 1;
	}
}

void rm_heap_postfork_parent(void)
{
	if (t_je_forking) {
		t_je_forking = 0;
		je_postfork_parent();
	}
}

/* In a child without its heap (MODE_LOST: its regions were not inherited,
 * conn.c) jemalloc is never called again, and its locks are not there. */
void rm_heap_postfork_child(void)
{
	if (t_je_forking) {
		t_je_forking = 0;
		if (rm_mode() != MODE_LOST)
			je_postfork_child();
	}
}
