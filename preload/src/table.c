/* The region table: the ranges registered with our userfaultfd and
 * announced to the agent, sorted by base; and the requests that change
 * it (REGION_ADD, REGION_DEL, REGION_ZAP). Only a req_mu holder changes
 * the table's layout, so such a holder may read it between table_mu
 * sections; everyone else reads it under table_mu. */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

struct region g_regions[MAX_REGIONS];
int g_nregions;
pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_full_said;

/* Index of the last region with base <= a, or -1. */
static int table_floor_locked(uintptr_t a)
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

static int table_find_locked(uintptr_t a)
{
	int i = table_floor_locked(a);
	if (i >= 0 && a - g_regions[i].base < g_regions[i].len)
		return i;
	return -1;
}

/* The index of the region holding all of [a, a+len), or -1. */
int table_covers_locked(uintptr_t a, size_t len)
{
	int i = table_find_locked(a);
	return i >= 0 && a + len - g_regions[i].base <= g_regions[i].len ? i : -1;
}

static int table_insert_locked(const struct region *r)
{
	if (g_nregions == MAX_REGIONS)
		return -1;
	int i = table_floor_locked(r->base) + 1;
	memmove(&g_regions[i + 1], &g_regions[i], (size_t)(g_nregions - i) * sizeof *r);
	g_regions[i] = *r;
	__atomic_store_n(&g_nregions, g_nregions + 1, __ATOMIC_RELEASE);
	return 0;
}

static void table_remove_locked(int i)
{
	memmove(&g_regions[i], &g_regions[i + 1], (size_t)(g_nregions - i - 1) * sizeof g_regions[0]);
	__atomic_store_n(&g_nregions, g_nregions - 1, __ATOMIC_RELEASE);
}

int overlaps_regions(uintptr_t a, size_t len)
{
	if (!__atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&table_mu);
	int i = table_floor_locked(a + len - 1);
	int hit = i >= 0 && g_regions[i].base + g_regions[i].len > a;
	pthread_mutex_unlock(&table_mu);
	return hit;
}

/* The first piece of [at, end) that lies in a region: returns 1 with the
 * region and the piece [*lo, *hi), or 0 when none is left. */
int next_piece(uintptr_t at, uintptr_t end, struct region *r, uintptr_t *lo, uintptr_t *hi)
{
	if (at >= end)
		return 0;
	pthread_mutex_lock(&table_mu);
	int i = table_floor_locked(at);
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

static int prot_flags(int prot)
{
	return (prot & (PROT_READ | PROT_WRITE)) == (PROT_READ | PROT_WRITE) ? 0 : R_NOTRW;
}

/* Registers [p, p+len) and announces it; on success the region is in the
 * table. prot: how it is mapped. Preconditions: req_mu held, connected. */
int add_region_locked(void *p, size_t len, int kind, int prot)
{
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)p, .len = len},
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
	};
	if (__atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE) == MAX_REGIONS) {
		if (!__atomic_exchange_n(&g_full_said, 1, __ATOMIC_ACQ_REL))
			say("rmem: region table full: further memory is ordinary memory", NULL);
		return -ENOSPC;
	}
	if (ioctl(g_uffd, UFFDIO_REGISTER, &reg) != 0)
		return -errno;
	raw_madvise(p, len, MADV_DONTFORK); /* see fork.c */
	struct region r = {(uintptr_t)p, len, g_next_id++, kind, prot_flags(prot)};
	struct rmem_region_add m = {r.id, r.base, r.len, (uint32_t)kind, 0};
	int err = request_locked(RMEM_REGION_ADD, &m, sizeof m);
	if (err) {
		ioctl(g_uffd, UFFDIO_UNREGISTER, &reg.range);
		raw_madvise(p, len, MADV_DOFORK);
		return err;
	}
	pthread_mutex_lock(&table_mu);
	table_insert_locked(&r);
	pthread_mutex_unlock(&table_mu);
	return 0;
}

/* Takes [a, a+len) out of every region it overlaps: REGION_DEL for each
 * piece, unregistered, then the table update. The caller unmaps or maps
 * over it afterwards: without a registration the kernel raises no UNMAP
 * event, which would block the unmapping thread until an agent read it
 * (forever once the agent is gone). Returns 0 or -ENOMEM if a split does
 * not fit in the table (nothing is changed then).
 * Preconditions: req_mu held; a and len page aligned. */
int punch_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len;
	for (;;) {
		struct region r;
		uintptr_t lo, hi;
		if (!next_piece(a, end, &r, &lo, &hi))
			return 0;
		if (lo > r.base && hi < r.base + r.len && __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE) == MAX_REGIONS)
			return -ENOMEM;

		if (is_connected()) {
			struct rmem_region_del m = {r.id, lo, hi - lo};
			int err = request_locked(RMEM_REGION_DEL, &m, sizeof m);
			if (err && err != -EPIPE)
				say("rmem: agent refused REGION_DEL (", errstr(-err), "): unmapping anyway", NULL);
		}
		struct uffdio_range rg = {lo, hi - lo};
		if (g_uffd >= 0)
			ioctl(g_uffd, UFFDIO_UNREGISTER, &rg);

		pthread_mutex_lock(&table_mu);
		int i = table_find_locked(lo);
		struct region *t = &g_regions[i];
		if (lo == t->base && hi == t->base + t->len) {
			table_remove_locked(i);
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
			table_insert_locked(&tail);
		}
		pthread_mutex_unlock(&table_mu);
	}
}

/* Tells the agent that [a, a+len) is being dropped (it reads as zeros from
 * now on): REGION_ZAP for each piece of a region it overlaps.
 * Preconditions: req_mu held; a and len page aligned. */
void zap_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len, at = a;
	struct region r;
	uintptr_t lo, hi;
	/* Without an agent hearing it, a page it journaled in the pool would
	 * come back with its old contents after the drop: wait for the next
	 * one (bounded: resume.c). */
	wait_resumed();
	while (is_connected() && next_piece(at, end, &r, &lo, &hi)) {
		struct rmem_region_del m = {r.id, lo, hi - lo};
		int err = request_locked(RMEM_REGION_ZAP, &m, sizeof m);
		if (err && err != -EPIPE)
			say("rmem: agent refused REGION_ZAP (", errstr(-err), ")", NULL);
		at = hi;
	}
}

/* Registers every region of the table with fd (a forked child's own
 * uffd) in mode. Returns 0 or -errno. Preconditions: the only thread. */
int register_all(int fd, uint64_t mode)
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
void fork_advice_locked(int advice)
{
	for (int i = 0; i < g_nregions; i++)
		raw_madvise((void *)g_regions[i].base, g_regions[i].len, advice);
}

/* ---- pending ranges ----
 *
 * Memory that should be a region but came before there could be a
 * connection: before our constructor ran (the helper thread is created
 * there), a foreign allocator's first chunks and the embedded jemalloc's
 * first heap chunks. Once connected they are registered (pending_register);
 * pages they already hold stay resident outside the agent's view (correct,
 * not paged). A pending range that is unmapped, remapped or mapped over
 * first is dropped and stays ordinary memory. */

#define MAX_PENDING 64
static struct {
	uintptr_t a;
	size_t len;
	int kind, prot;
} g_pending[MAX_PENDING]; /* table_mu */
static int g_npending;     /* atomic loads */

void pending_add(uintptr_t a, size_t len, int kind, int prot)
{
	pthread_mutex_lock(&table_mu);
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

int pending_count(void) { return __atomic_load_n(&g_npending, __ATOMIC_ACQUIRE); }

static void pending_drop_locked(uintptr_t a, size_t len)
{
	for (int i = 0; i < g_npending;) {
		if (g_pending[i].a < a + len && a < g_pending[i].a + g_pending[i].len) {
			g_pending[i] = g_pending[g_npending - 1];
			__atomic_store_n(&g_npending, g_npending - 1, __ATOMIC_RELEASE);
		} else {
			i++;
		}
	}
}

/* Drops the pending ranges [a, a+len) overlaps. Serialized with
 * pending_register by req_mu, so that a range is never registered after
 * its memory went away. */
void pending_drop(uintptr_t a, size_t len)
{
	if (!pending_count())
		return;
	req_lock();
	pthread_mutex_lock(&table_mu);
	pending_drop_locked(a, len);
	pthread_mutex_unlock(&table_mu);
	req_unlock();
}

/* Sets flags on the regions (and pending ranges) [a, a+len) overlaps. */
void table_mark(uintptr_t a, size_t len, int flags)
{
	pthread_mutex_lock(&table_mu);
	int i = table_floor_locked(a);
	if (i < 0 || g_regions[i].base + g_regions[i].len <= a)
		i++;
	for (; i < g_nregions && g_regions[i].base < a + len; i++)
		g_regions[i].flags |= flags;
	for (int i = 0; i < g_npending; i++)
		if (g_pending[i].a < a + len && a < g_pending[i].a + g_pending[i].len && (flags & R_UNREADABLE))
			g_pending[i].kind = -g_pending[i].kind; /* dropped at registration */
	pthread_mutex_unlock(&table_mu);
}

/* Registers the pending ranges. Preconditions: connected, req_mu not
 * held, in_shim set. */
void pending_register(void)
{
	if (!pending_count())
		return;
	req_lock();
	for (;;) {
		pthread_mutex_lock(&table_mu);
		int n = g_npending;
		uintptr_t a = n ? g_pending[n - 1].a : 0;
		size_t len = n ? g_pending[n - 1].len : 0;
		int kind = n ? g_pending[n - 1].kind : 0, prot = n ? g_pending[n - 1].prot : 0;
		if (n)
			__atomic_store_n(&g_npending, n - 1, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&table_mu);
		if (!n)
			break;
		if (kind > 0 && is_connected())
			add_region_locked((void *)a, len, kind, prot);
	}
	req_unlock();
}
