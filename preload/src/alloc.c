/* The process's mode, decided once, and the malloc family.
 *
 * glibc mode: the program's malloc is ours (dlsym(RTLD_DEFAULT) finds the
 * shim's) and the next one is libc.so.6's. Then the shim is the process's
 * allocator (glibc supports replacing malloc) and every allocation comes
 * from the jemalloc embedded in librmem.so, whose memory lives in one
 * reservation whose chunks are regions (heap.c): small allocations are
 * paged too. Ownership is positional: a pointer inside the reservation is
 * jemalloc's, any other goes back to glibc (the shim's own allocations,
 * those made during a fork, before the mode was known). glibc's functions
 * come from dlsym(RTLD_NEXT), never __libc_malloc & co., which tcmalloc
 * and mimalloc define too.
 *
 * foreign mode: any other allocator (in the executable, statically linked;
 * a jemalloc, tcmalloc or mimalloc after us in the lookup order, such as
 * redis-server's libjemalloc.so.2). Every function here forwards to it,
 * the shim's own allocations included, and the ones it lacks are built
 * on those it has, so that no pointer reaches an allocator that did not
 * make it. Its memory arrives through mmap or sbrk and is paged there
 * (interpose.c).
 *
 * The decision allocates nothing (dlsym and dladdr on their success
 * path); it is made at the process's first call into the shim (often from
 * another library's constructor, or inside a foreign allocator's first
 * mmap) or in our constructor, whichever comes first. An allocation made
 * while it is being made (by dlsym, on the deciding thread) comes from a
 * small static arena whose frees are ignored. The mode decided is kept by
 * mode.c. */
#include "rmem.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void cfree(void *); /* gone from glibc's headers, still in old binaries */

static TLS int t_deciding;
static pthread_mutex_t mode_mu = PTHREAD_MUTEX_INITIALIZER;

struct fns {
	void *(*malloc)(size_t);
	void (*free)(void *);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void *(*memalign)(size_t, size_t);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
	void *(*reallocarray)(void *, size_t, size_t);
	size_t (*usable)(void *);
};
static struct fns libc; /* glibc's own */
static struct fns fa;   /* the foreign allocator's; NULL: it lacks that one */

/* libc.so.6's code, [lo, hi): in ring mode (glibc mode) its own small
 * allocations are glibc's, not the heap's. glibc passes them to the
 * kernel from inside itself, where no wrapper sees the call: stdio's FILE
 * buffers (read(2) into them), a DIR's (getdents), the FILE locks' futex
 * words; in ring mode a kernel access to a page of the heap that is
 * missing (evicted, or never touched yet) fails with EFAULT. Big ones
 * (qsort's copy, a long line's buffer) stay paged: they are the program's
 * data, and glibc fills them from user mode. */
static uintptr_t g_libc_lo, g_libc_hi;
#define LIBC_SMALL (64u << 10)

static int find_libc(struct dl_phdr_info *info, size_t size, void *base)
{
	(void)size;
	if ((void *)info->dlpi_addr != base && !(info->dlpi_name && strstr(info->dlpi_name, "/libc.so.6")))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			g_libc_lo = info->dlpi_addr + ph->p_vaddr;
			g_libc_hi = g_libc_lo + ph->p_memsz;
		}
	}
	return 1;
}

/* Whether an allocation of n bytes that ra called is glibc's own, small,
 * in ring mode. */
static inline int for_libc(void *ra, size_t n)
{
	return unlikely(rm_ring_mode) && n <= LIBC_SMALL && (uintptr_t)ra - g_libc_lo < g_libc_hi - g_libc_lo;
}

/* ---- the bootstrap arena ---- */

#define BOOT_SIZE (64u << 10)
static char g_boot[BOOT_SIZE] __attribute__((aligned(4096)));
static size_t g_boot_used;

static int in_boot(const void *p) { return (uintptr_t)p - (uintptr_t)g_boot < BOOT_SIZE; }
static size_t boot_size(const void *p) { return ((const size_t *)p)[-2]; }

/* n bytes (zeroed: the arena is never reused) at alignment align. */
static void *boot_alloc(size_t n, size_t align)
{
	if (align < 16)
		align = 16;
	if (n > BOOT_SIZE || align > 4096) {
		errno = ENOMEM;
		return NULL;
	}
	size_t used = __atomic_load_n(&g_boot_used, __ATOMIC_RELAXED);
	for (;;) {
		size_t at = round_up(used + 16, align), next = at + round_up(n ? n : 1, 16);
		if (next > BOOT_SIZE) {
			errno = ENOMEM;
			return NULL;
		}
		if (__atomic_compare_exchange_n(&g_boot_used, &used, next, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
			((size_t *)(g_boot + at))[-2] = n;
			return g_boot + at;
		}
	}
}

/* ---- deciding the mode ---- */

static void *base_of(void *sym)
{
	Dl_info di;
	return sym && dladdr(sym, &di) ? di.dli_fbase : NULL;
}

/* The object that defines the function at p, as dlsym found it: NULL when
 * p is no definition but a non-PIE executable's PLT entry for a function
 * it only uses (its dynamic symbol is undefined with the PLT address as
 * value, the function's canonical address: /usr/bin/python3 on Debian).
 * Such an entry calls whatever the lookup order binds, not an allocator
 * of the executable's own. */
static void *definer_of(void *p)
{
	Dl_info di;
	const ElfW(Sym) *sym = NULL;
	if (!p || !dladdr1(p, &di, (void **)&sym, RTLD_DL_SYMENT))
		return NULL;
	if (sym && sym->st_shndx == SHN_UNDEF)
		return NULL;
	return di.dli_fbase;
}

/* The symbol name from handle if the object at base defines it. Only
 * names that some object after us defines (libc.so.6 defines all these;
 * with RTLD_DEFAULT we do): dlsym's failure path allocates its error
 * message, inside the allocator we may be deciding for (measured: a
 * deadlock in jemalloc's initialization; so no cfree, which glibc keeps
 * as a compatibility symbol only). */
static void *sym_in(void *handle, const char *name, void *base)
{
	void *p = dlsym(handle, name);
	return p && base_of(p) == base ? p : NULL;
}

#define LOOKUP(f, handle, base)                                                          \
	do {                                                                             \
		(f)->malloc = (void *(*)(size_t))sym_in(handle, "malloc", base);          \
		(f)->free = (void (*)(void *))sym_in(handle, "free", base);               \
		(f)->calloc = (void *(*)(size_t, size_t))sym_in(handle, "calloc", base);  \
		(f)->realloc = (void *(*)(void *, size_t))sym_in(handle, "realloc", base); \
		(f)->memalign = (void *(*)(size_t, size_t))sym_in(handle, "memalign", base); \
		(f)->posix_memalign =                                                     \
			(int (*)(void **, size_t, size_t))sym_in(handle, "posix_memalign", base); \
		(f)->aligned_alloc = (void *(*)(size_t, size_t))sym_in(handle, "aligned_alloc", base); \
		(f)->valloc = (void *(*)(size_t))sym_in(handle, "valloc", base);          \
		(f)->pvalloc = (void *(*)(size_t))sym_in(handle, "pvalloc", base);        \
		(f)->reallocarray =                                                       \
			(void *(*)(void *, size_t, size_t))sym_in(handle, "reallocarray", base); \
		(f)->usable = (size_t(*)(void *))sym_in(handle, "malloc_usable_size", base); \
	} while (0)

/* Decides the mode (once; the others wait on mode_mu). Returns it, or
 * MODE_UNKNOWN to a call made while this thread decides (dlsym's). */
static int decide(void)
{
	if (t_deciding)
		return MODE_UNKNOWN;
	rm_lock(&mode_mu);
	int m = rm_mode();
	if (m != MODE_UNKNOWN) {
		pthread_mutex_unlock(&mode_mu);
		return m;
	}
	t_deciding = 1;
	rm_shim_enter();
	rm_init_config();
	void *me = base_of((void *)decide);
	void *libc_base = base_of(dlsym(RTLD_NEXT, "gnu_get_libc_version"));
	LOOKUP(&libc, RTLD_NEXT, libc_base);
	void *handle = RTLD_DEFAULT, *base = definer_of(dlsym(RTLD_DEFAULT, "malloc"));
	if (base == me || base == NULL) { /* ours first (or a PLT entry that binds to ours) */
		handle = RTLD_NEXT;
		base = base_of(dlsym(RTLD_NEXT, "malloc"));
	}
	if (handle == RTLD_NEXT && base && base == libc_base && libc.malloc && libc.free && libc.calloc &&
	    libc.realloc && libc.memalign && libc.usable) {
		m = rm_heap_reserve() == 0 ? MODE_GLIBC : MODE_LIBC;
		dl_iterate_phdr(find_libc, libc_base);
	} else {
		m = MODE_FOREIGN;
		LOOKUP(&fa, handle, base);
		if (!fa.malloc || !fa.free || !fa.realloc) {
			/* An allocator without them could not work without us
			 * either; do what the program would do without us. */
			rm_say("rmem: the program's malloc comes without free or realloc: using glibc's for those", NULL);
			fa.malloc = fa.malloc ? fa.malloc : libc.malloc;
			fa.free = fa.free ? fa.free : libc.free;
			fa.realloc = fa.realloc ? fa.realloc : libc.realloc;
		}
	}
	rm_mode_page_init(m);
	rm_fork_register(); /* fork.c's handlers: the one call up the layers (rmem.h) */
	rm_mode_publish(m);
	rm_shim_leave();
	t_deciding = 0;
	pthread_mutex_unlock(&mode_mu);
	return m;
}

/* The shim's first entry from anywhere: decides the mode. */
void rm_enter(void)
{
	if (unlikely(!rm_mode()))
		decide();
}

/* The mode for a call that found MODE_UNKNOWN on the mode page: not
 * decided yet (MODE_UNKNOWN while deciding), or this is a child forked
 * past fork(3) (unless in_fork: a fork(3) child before our handler). */
static int mode_slow(void)
{
	int m = rm_mode();
	if (m == MODE_UNKNOWN)
		return decide();
	if (rm_mode_here() == m || rm_in_fork())
		return m;
	rm_conn_astray();
	return rm_mode();
}

static int mode(void)
{
	int m = rm_mode_here();
	return m ? m : mode_slow();
}

enum route { TO_JE, TO_LIBC, TO_FOREIGN, TO_BOOT };

static int route(void)
{
	if (unlikely(rm_in_boot()))
		return TO_BOOT;
	switch (mode()) {
	case MODE_GLIBC:
		return rm_in_shim() || rm_in_fork() ? TO_LIBC : TO_JE;
	case MODE_FOREIGN:
		return TO_FOREIGN;
	case MODE_UNKNOWN:
		return TO_BOOT;
	default:
		return TO_LIBC;
	}
}

static int fast(void)
{
	return rm_mode_here() == MODE_GLIBC && !(rm_guard.in_shim | rm_guard.in_fork | rm_guard.boot);
}

/* A pointer into the heap where there is none (a child forked past
 * fork(3)): touching it raises SIGSEGV (its region was not inherited and
 * its address is reserved inaccessible); if it does not, say why we stop. */
static void lost_pointer(void *p)
{
	(void)*(volatile char *)p;
	rm_say("rmem: a child forked without fork(3) used a pointer into its parent's heap, which it did not inherit",
	    NULL);
	abort();
}

/* ---- during a fork ----
 *
 * Between our prepare and parent/child handlers (fork.c) this thread holds
 * jemalloc's locks: it allocates from glibc, and frees of jemalloc's
 * pointers wait here until the handler has released them. */

#define MAX_DEFERRED_FREES 256
static void *g_dfree[MAX_DEFERRED_FREES];
static int g_ndfree;

static void defer_free(void *p)
{
	if (g_ndfree < MAX_DEFERRED_FREES)
		g_dfree[g_ndfree++] = p; /* else leaked: a fork handler freeing hundreds */
}

void rm_alloc_run_deferred(void)
{
	for (int i = 0; i < g_ndfree && rm_mode() != MODE_LOST; i++) /* lost: the heap is gone */
		rm_je_free(g_dfree[i]);
	g_ndfree = 0;
}

/* ---- the foreign allocator's functions, or ours on top of its ---- */

static void *f_memalign(size_t align, size_t n)
{
	if (fa.memalign)
		return fa.memalign(align, n);
	if (fa.posix_memalign) {
		void *p;
		int err = fa.posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, n);
		if (err) {
			errno = err;
			return NULL;
		}
		return p;
	}
	if (fa.aligned_alloc && !add_overflows(n, align))
		return fa.aligned_alloc(align, round_up(n ? n : 1, align));
	/* No aligned allocation at all: a header in front of a malloc'd
	 * block would reach its free() misaligned. */
	errno = ENOMEM;
	return NULL;
}

static void *f_calloc(size_t n, size_t size)
{
	size_t total;
	if (fa.calloc)
		return fa.calloc(n, size);
	if (__builtin_mul_overflow(n, size, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	void *p = fa.malloc(total);
	if (p)
		memset(p, 0, total);
	return p;
}

/* ---- the malloc family ---- */

/* jemalloc's blocks of a large size class (from 4 pages: its small
 * classes end below) are asked for page aligned. Left to itself it offsets
 * each by a random multiple of 64 bytes within an extra page ("cache
 * oblivious", not a runtime option in 5.3): a page more per block, and big
 * blocks that start mid-page (programs madvise and mprotect big blocks,
 * as they could with the shim's old per-allocation mappings). */
static size_t large(void) { return 4 * rm_page; }
static int lg_page(void) { return __builtin_ctzl(rm_page); }

static void *je_malloc(size_t n) { return n < large() ? rm_je_malloc(n) : rm_je_mallocx(n, lg_page()); }

static void *je_calloc(size_t n, size_t size)
{
	size_t total;
	if (__builtin_mul_overflow(n, size, &total) || total < large())
		return rm_je_calloc(n, size);
	return rm_je_mallocx(total, lg_page() | RM_JE_ZERO);
}

static void *je_realloc(void *p, size_t n) { return n < large() ? rm_je_realloc(p, n) : rm_je_rallocx(p, n, lg_page()); }

static void *malloc_slow(size_t n)
{
	switch (route()) {
	case TO_JE: {
		void *p = je_malloc(n);
		return p ? p : libc.malloc(n); /* the heap is full (heap.c says so) */
	}
	case TO_LIBC:
		return libc.malloc(n);
	case TO_FOREIGN:
		return fa.malloc(n);
	default:
		return boot_alloc(n, 16);
	}
}

EXPORT void *malloc(size_t n)
{
	if (for_libc(__builtin_return_address(0), n) && rm_mode_here() == MODE_GLIBC)
		return libc.malloc(n);
	if (likely(fast())) {
		void *p = je_malloc(n);
		if (likely(p != NULL))
			return p;
	}
	return malloc_slow(n);
}

EXPORT void *calloc(size_t n, size_t size)
{
	size_t total;
	void *p;
	if (!__builtin_mul_overflow(n, size, &total) && for_libc(__builtin_return_address(0), total) &&
	    rm_mode_here() == MODE_GLIBC)
		return libc.calloc(n, size);
	switch (route()) {
	case TO_JE:
		p = je_calloc(n, size);
		return p || __builtin_mul_overflow(n, size, &total) ? p : libc.calloc(n, size);
	case TO_LIBC:
		return libc.calloc(n, size);
	case TO_FOREIGN:
		return f_calloc(n, size);
	default:
		if (__builtin_mul_overflow(n, size, &total)) {
			errno = ENOMEM;
			return NULL;
		}
		return boot_alloc(total, 16);
	}
}

static void other_free(void *p)
{
	if (in_boot(p))
		return;
	if (mode() == MODE_FOREIGN)
		fa.free(p);
	else if (libc.free)
		libc.free(p);
}

static void heap_free_slow(void *p)
{
	int m = mode();
	if (rm_in_fork())
		defer_free(p);
	else if (m != MODE_LOST)
		rm_je_free(p);
}

EXPORT void free(void *p)
{
	if (in_heap(p)) {
		if (likely(rm_mode_here() == MODE_GLIBC && !rm_in_fork()))
			rm_je_free(p);
		else
			heap_free_slow(p);
		return;
	}
	if (p)
		other_free(p);
}

EXPORT void cfree(void *p) { free(p); }

/* realloc of p, which is not the heap's: glibc's, the foreign
 * allocator's or the bootstrap arena's. */
static void *realloc_other(void *p, size_t n)
{
	int r = route();
	if (in_boot(p)) {
		void *q = n ? malloc(n) : NULL;
		if (q)
			memcpy(q, p, boot_size(p) < n ? boot_size(p) : n);
		return q;
	}
	if (r == TO_FOREIGN)
		return fa.realloc(p, n);
	if (r == TO_JE && n) {
		/* One of glibc's (made while the shim allocated, or during a
		 * fork): it moves into the heap, to be paged. */
		void *q = je_malloc(n);
		if (q) {
			size_t old = libc.usable(p);
			memcpy(q, p, old < n ? old : n);
			libc.free(p);
			return q;
		}
	}
	return libc.realloc(p, n);
}

static void *realloc_heap(void *p, size_t n)
{
	if (mode() == MODE_LOST)
		lost_pointer(p);
	if (!n) { /* glibc's realloc(p, 0): frees, returns NULL */
		free(p);
		return NULL;
	}
	void *q = rm_in_fork() ? NULL : je_realloc(p, n);
	if (q)
		return q;
	q = libc.malloc(n); /* during a fork, or the heap is full */
	if (q) {
		size_t old = rm_je_malloc_usable_size(p);
		memcpy(q, p, old < n ? old : n);
		free(p);
	}
	return q;
}

EXPORT void *realloc(void *p, size_t n)
{
	if (in_heap(p)) {
		if (likely(rm_mode_here() == MODE_GLIBC && !rm_in_fork() && n)) {
			void *q = je_realloc(p, n);
			if (likely(q != NULL))
				return q;
		}
		return realloc_heap(p, n);
	}
	int own = for_libc(__builtin_return_address(0), n) && rm_mode_here() == MODE_GLIBC;
	if (!p)
		return own ? libc.malloc(n) : malloc(n);
	if (own && !in_boot(p))
		return libc.realloc(p, n); /* glibc's own stays glibc's (getline's, open_memstream's) */
	return realloc_other(p, n);
}

EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
	size_t total;
	if (route() == TO_FOREIGN && fa.reallocarray && !in_boot(p))
		return fa.reallocarray(p, n, size);
	if (__builtin_mul_overflow(n, size, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, total);
}

static int pow2(size_t a) { return a && !(a & (a - 1)); }

/* n bytes at alignment align (a power of two). */
static void *aligned(size_t align, size_t n)
{
	void *p;
	switch (route()) {
	case TO_JE:
		p = rm_je_memalign(align, n);
		return p ? p : libc.memalign(align, n);
	case TO_LIBC:
		return libc.memalign(align, n);
	case TO_FOREIGN:
		return f_memalign(align, n);
	default:
		return boot_alloc(n, align);
	}
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	if (route() == TO_FOREIGN && fa.posix_memalign)
		return fa.posix_memalign(out, align, n);
	if (!pow2(align) || align % sizeof(void *))
		return EINVAL;
	int e = errno;
	void *p = aligned(align, n);
	if (!p)
		return ENOMEM;
	errno = e; /* posix_memalign leaves errno alone */
	*out = p;
	return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	if (route() == TO_FOREIGN && fa.aligned_alloc)
		return fa.aligned_alloc(align, n);
	if (!pow2(align)) {
		errno = EINVAL;
		return NULL;
	}
	return aligned(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
	if (align > ((size_t)1 << 63)) {
		errno = EINVAL;
		return NULL;
	}
	if (!pow2(align)) /* glibc rounds up; so do we */
		align = align ? (size_t)1 << (64 - __builtin_clzl(align)) : 1;
	return aligned(align, n);
}

EXPORT void *valloc(size_t n)
{
	if (route() == TO_FOREIGN && fa.valloc)
		return fa.valloc(n);
	return aligned(rm_page, n);
}

EXPORT void *pvalloc(size_t n)
{
	if (route() == TO_FOREIGN && fa.pvalloc)
		return fa.pvalloc(n);
	if (add_overflows(n, rm_page)) {
		errno = ENOMEM;
		return NULL;
	}
	return aligned(rm_page, round_up(n ? n : 1, rm_page));
}

EXPORT size_t malloc_usable_size(void *p)
{
	if (in_heap(p)) {
		if (mode() == MODE_LOST)
			lost_pointer(p);
		return rm_je_malloc_usable_size(p);
	}
	if (!p)
		return 0;
	if (in_boot(p))
		return boot_size(p);
	if (mode() == MODE_FOREIGN)
		return fa.usable ? fa.usable(p) : 0;
	return libc.usable ? libc.usable(p) : 0;
}

/* ---- the constructor ----
 *
 * Priority 101: before the embedded jemalloc's own constructor (in
 * librmem.so's .init_array at the default priority), so that the mode is
 * decided when jemalloc first runs (in foreign mode its initialization
 * finds no heap to map and stays idle). */
__attribute__((constructor(101))) static void rmem_init(void)
{
	rm_enter();
	rm_conn_init();
	/* The helper's allocations (its TLS vector): glibc's in glibc mode;
	 * in foreign mode the allocator's, whose first mapping this may be,
	 * to be paged (pending) like the others. */
	int glibc = rm_mode() != MODE_FOREIGN;
	if (glibc)
		rm_shim_enter();
	int err = rm_helper_start();
	if (glibc)
		rm_shim_leave();
	rm_shim_enter();
	if (err)
		rm_say("rmem: cannot start the helper thread (", rm_errstr(err), "): using ordinary memory", NULL);
	rm_region_open(); /* and registers what came before us */
	rm_shim_leave();
}
