/* The region table: the ranges registered with our userfaultfd and
 * announced to the agent, sorted by base; and the pending ranges. This
 * file is their only writer, under table_mu. Only a req_mu holder changes
 * the table's layout (region.c's requests; conn.c's fork transitions hold
 * req_mu across a fork), so such a holder may read it between table_mu
 * sections; everyone else reads it under table_mu (rm_table_lock). The
 * count is an atomic, readable without the lock. Nothing here allocates. */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

static struct region g_regions[MAX_REGIONS]; /* sorted by base; table_mu */
static int g_nregions;                        /* atomic loads */
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
/* Odd while a table_mu holder changes g_regions: what rm_table_span, which
 * reads the table without the lock, checks. */
static unsigned g_tseq;

static void write_begin(void) { __atomic_store_n(&g_tseq, g_tseq + 1, __ATOMIC_SEQ_CST); }
static void write_end(void) { __atomic_store_n(&g_tseq, g_tseq + 1, __ATOMIC_RELEASE); }

void rm_table_lock(void) { rm_lock(&table_mu); }
void rm_table_unlock(void) { pthread_mutex_unlock(&table_mu); }

/* In a fork child, the only thread: the helper may have held table_mu. */
void rm_table_atfork_child(void)
{
	pthread_mutex_init(&table_mu, NULL);
	g_tseq &= ~1u;
}

int rm_table_count(void) { return __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE); }
int rm_table_full(void) { return rm_table_count() == MAX_REGIONS; }

/* Region i (0 <= i < rm_table_count()). Preconditions: table_mu held. */
struct region rm_table_at_locked(int i) { return g_regions[i]; }

/* Index of the last region with base <= a, or -1. */
static int floor_locked(uintptr_t a)
{
	int lo = 0, hi = g_nregions; /* answer in [lo-1, hi) */
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (g_regions[mid].base <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo - 1;
}

static int find_locked(uintptr_t a)
{
	int i = floor_locked(a);
	if (i >= 0 && a - g_regions[i].base < g_regions[i].len)
		return i;
	return -1;
}

/* Whether one region holds all of [a, a+len): 1 with its flags in *flags
 * and its kind in *kind (unless kind is NULL), else 0. Preconditions:
 * table_mu held. */
int rm_table_covers_locked(uintptr_t a, size_t len, int *flags, int *kind)
{
	int i = find_locked(a);
	if (i < 0 || a + len - g_regions[i].base > g_regions[i].len)
		return 0;
	*flags = g_regions[i].flags;
	if (kind)
		*kind = g_regions[i].kind;
	return 1;
}

static int insert_locked(const struct region *r)
{
	if (g_nregions == MAX_REGIONS)
		return -1;
	int i = floor_locked(r->base) + 1;
	memmove(&g_regions[i + 1], &g_regions[i], (size_t)(g_nregions - i) * sizeof *r);
	g_regions[i] = *r;
	__atomic_store_n(&g_nregions, g_nregions + 1, __ATOMIC_RELEASE);
	return 0;
}

/* Preconditions (both): table_mu held, write_begin done. */
static void remove_locked(int i)
{
	memmove(&g_regions[i], &g_regions[i + 1], (size_t)(g_nregions - i - 1) * sizeof g_regions[0]);
	__atomic_store_n(&g_nregions, g_nregions - 1, __ATOMIC_RELEASE);
}

/* Where a lies, without the lock (ring mode's wrappers, which may run in
 * a signal handler, on every system call with a buffer): 1 when a region
 * holds a, *end its end and *flags its flags; 0 when none does, *end where
 * the next one begins (or the top of the address space); -1 when the
 * table kept changing (a writer this thread interrupted, say): unknown. */
int rm_table_span(uintptr_t a, uintptr_t *end, int *flags)
{
	for (int tries = 0; tries < 64; tries++) {
		unsigned s = __atomic_load_n(&g_tseq, __ATOMIC_ACQUIRE);
		if (s & 1)
			continue;
		int n = __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE), lo = 0, hi = n;
		if (n > MAX_REGIONS)
			continue;
		while (lo < hi) { /* the last region with base <= a */
			int mid = (lo + hi) / 2;
			if (__atomic_load_n(&g_regions[mid].base, __ATOMIC_RELAXED) <= a)
				lo = mid + 1;
			else
				hi = mid;
		}
		int i = lo - 1, in = 0, fl = 0;
		uintptr_t e = UINTPTR_MAX;
		if (i >= 0 && a - g_regions[i].base < g_regions[i].len) {
			in = 1;
			e = g_regions[i].base + g_regions[i].len;
			fl = g_regions[i].flags;
		} else if (i + 1 < n) {
			e = g_regions[i + 1].base;
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&g_tseq, __ATOMIC_RELAXED) != s || e <= a)
			continue;
		*end = e;
		*flags = fl;
		return in;
	}
	return -1;
}

/* Adds r (registered and announced). Preconditions: req_mu held. */
void rm_table_insert(const struct region *r)
{
	rm_lock(&table_mu);
	write_begin();
	insert_locked(r);
	write_end();
	pthread_mutex_unlock(&table_mu);
}

/* Takes [lo, hi), which lies in one region, out of it: the region
 * shrinks, goes or splits in two (the caller checked there is room for
 * the split). Preconditions: req_mu held. */
void rm_table_cut(uintptr_t lo, uintptr_t hi)
{
	rm_lock(&table_mu);
	int i = find_locked(lo);
	struct region *t = &g_regions[i];
	write_begin();
	if (lo == t->base && hi == t->base + t->len) {
		remove_locked(i);
	} else if (lo == t->base) {
		t->len -= hi - lo;
		t->base = hi;
	} else if (hi == t->base + t->len) {
		t->len = lo - t->base;
	} else {
		struct region tail = *t;
		tail.base = hi;
		tail.len = t->base + t->len - hi;
		t->len = lo - t->base;
		insert_locked(&tail);
	}
	write_end();
	pthread_mutex_unlock(&table_mu);
}

int rm_table_overlaps(uintptr_t a, size_t len)
{
	if (!rm_table_count())
		return 0;
	rm_lock(&table_mu);
	int i = floor_locked(a + len - 1);
	int hit = i >= 0 && g_regions[i].base + g_regions[i].len > a;
	pthread_mutex_unlock(&table_mu);
	return hit;
}

/* The first piece of [at, end) that lies in a region: returns 1 with the
 * region and the piece [*lo, *hi), or 0 when none is left. */
int rm_table_next_piece(uintptr_t at, uintptr_t end, struct region *r, uintptr_t *lo, uintptr_t *hi)
{
	if (at >= end)
		return 0;
	rm_lock(&table_mu);
	int i = floor_locked(at);
	if (i < 0 || g_regions[i].base + g_regions[i].len <= at)
		i++;
	int found = i < g_nregions && g_regions[i].base < end;
	if (found)
		*r = g_regions[i];
	pthread_mutex_unlock(&table_mu);
	if (!found)
		return 0;
	*lo = r->base > at ? r->base : at;
	*hi = r->base + r->len < end ? r->base + r->len : end;
	return 1;
}

/* Registers every region of the table with fd (a forked child's own
 * uffd) in mode. Returns 0 or -errno. Preconditions: the only thread. */
int rm_table_register_all(int fd, uint64_t mode)
{
	for (int i = 0; i < g_nregions; i++) {
		struct uffdio_register reg = {
			.range = {.start = g_regions[i].base, .len = g_regions[i].len},
			.mode = mode,
		};
		if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0)
			return -errno;
	}
	return 0;
}

/* Sets advice (MADV_DOFORK, MADV_DONTFORK) on every region.
 * Preconditions: req_mu held (no writer of the layout), or the only
 * thread. */
void rm_table_fork_advice(int advice)
{
	for (int i = 0; i < g_nregions; i++)
		rm_raw_madvise((void *)g_regions[i].base, g_regions[i].len, advice);
}

/* Reserves the regions' addresses inaccessible, in a child that did not
 * inherit them (rm_conn_astray): touching one raises SIGSEGV, and no other
 * mapping lands where the table still names a region. Preconditions: the
 * only thread. */
void rm_table_fence(void)
{
	for (int i = 0; i < g_nregions; i++)
		rm_raw_mmap((void *)g_regions[i].base, g_regions[i].len, PROT_NONE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
}

/* Whether a region is the heap's. Preconditions: the only thread. */
int rm_table_has_heap(void)
{
	for (int i = 0; i < g_nregions; i++)
		if (g_regions[i].kind == KIND_HEAP)
			return 1;
	return 0;
}

/* ---- pending ranges ----
 *
 * Memory that should be a region but came before there could be a
 * connection: before our constructor ran (the helper thread is created
 * there), a foreign allocator's first chunks and the embedded jemalloc's
 * first heap chunks. Once connected they are registered (region.c's
 * pending_register); pages they already hold stay resident outside the
 * agent's view (correct, not paged). A pending range that is unmapped,
 * remapped or mapped over first is dropped and stays ordinary memory. */

#define MAX_PENDING 64
static struct {
	uintptr_t a;
	size_t len;
	int kind, prot;
} g_pending[MAX_PENDING]; /* table_mu */
static int g_npending;     /* atomic loads */

void rm_pending_add(uintptr_t a, size_t len, int kind, int prot)
{
	rm_lock(&table_mu);
	int dup = 0;
	for (int i = 0; i < g_npending && !dup; i++)
		dup = g_pending[i].a == a && g_pending[i].len == len;
	if (!dup && g_npending < MAX_PENDING) {
		g_pending[g_npending].a = a;
		g_pending[g_npending].len = len;
		g_pending[g_npending].kind = kind;
		g_pending[g_npending].prot = prot;
		__atomic_store_n(&g_npending, g_npending + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&table_mu);
}

int rm_pending_count(void) { return __atomic_load_n(&g_npending, __ATOMIC_ACQUIRE); }

/* Drops the pending ranges [a, a+len) overlaps. Preconditions: req_mu
 * held (rm_region_pending_drop), so that a range is never registered after
 * its memory went away. */
void rm_pending_drop(uintptr_t a, size_t len)
{
	rm_lock(&table_mu);
	for (int i = 0; i < g_npending;) {
		if (g_pending[i].a < a + len && a < g_pending[i].a + g_pending[i].len) {
			g_pending[i] = g_pending[g_npending - 1];
			__atomic_store_n(&g_npending, g_npending - 1, __ATOMIC_RELEASE);
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&table_mu);
}

/* Takes the last pending range: 1 with it, or 0 when none is left. A kind
 * below 0 is a range to drop (R_UNREADABLE: rm_table_mark). */
int rm_pending_pop(uintptr_t *a, size_t *len, int *kind, int *prot)
{
	rm_lock(&table_mu);
	int n = g_npending;
	if (n) {
		*a = g_pending[n - 1].a;
		*len = g_pending[n - 1].len;
		*kind = g_pending[n - 1].kind;
		*prot = g_pending[n - 1].prot;
		__atomic_store_n(&g_npending, n - 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&table_mu);
	return n > 0;
}

/* Sets flags on the regions (and pending ranges) [a, a+len) overlaps. */
void rm_table_mark(uintptr_t a, size_t len, int flags)
{
	rm_lock(&table_mu);
	int i = floor_locked(a);
	if (i < 0 || g_regions[i].base + g_regions[i].len <= a)
		i++;
	write_begin();
	for (; i < g_nregions && g_regions[i].base < a + len; i++)
		g_regions[i].flags |= flags;
	write_end();
	for (int i = 0; i < g_npending; i++)
		if (g_pending[i].a < a + len && a < g_pending[i].a + g_pending[i].len && (flags & R_UNREADABLE))
			g_pending[i].kind = -g_pending[i].kind; /* dropped at registration */
	pthread_mutex_unlock(&table_mu);
}
