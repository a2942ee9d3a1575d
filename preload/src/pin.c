/* Pins: the pages of a buffer a system call hands the kernel stay present
 * until the call returns (ring mode).
 *
 * In ring mode a kernel access to a missing page, or a kernel write to a
 * write-protected one, does not fault to anyone: the system call fails
 * with EFAULT. So the wrappers (kcall.c, kwait.c, spawn.c) make the
 * buffers' pages present first, from user mode, where a fault is served
 * (rm_touch: a read of a byte per page for what the kernel reads, an
 * atomic add of 0 for what it writes, which also has a clean
 * write-protected page made writable), and keep them so for the call: the
 * helper thread, which drops every evicted page (helper.c), takes no
 * pinned page.
 *
 * The protocol, Dekker's, with a full fence on each side:
 *
 *   a thread   publishes its pin (its slot's ranges), fences, then looks
 *              at the eviction under way (g_eseq odd): if one is and it
 *              may take a page of its buffers, it waits for that batch to
 *              end (a futex on g_eseq); then it touches its pages.
 *   the helper publishes the batch's victims (g_eseq odd), fences, then
 *              reads every slot: it takes the victims from the first up
 *              to the first pinned one, and says EBUSY for the rest
 *              (EVICTED reports the pages done from the first).
 *
 * Either the helper sees the pin, or the thread sees the batch. Pins cost
 * no lock and no system call: a thread claims a slot of the table once
 * (a compare-and-swap), then a pin is a few stores and a fence. A call
 * from a signal handler that interrupted a pinned call nests: a slot's
 * ranges are a stack. A thread that dies inside a pinned call (cancelled
 * in read(2)) leaves its pin: the helper drops the pins of threads that
 * are gone when they stop a batch. What pins more than a slot holds, or
 * finds no slot, pins everything (g_all); so do the calls whose buffers
 * are many and short-lived (posix_spawn, exec: spawn.c).
 *
 * A thread's alternate signal stack (sigaltstack, kwait.c) is pinned as
 * long as it is set: the kernel writes signal frames there.
 *
 * This file owns the pin table and the eviction's publication; nothing
 * here allocates, and the thread's side is async-signal-safe. */
#include "rmem.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PIN_SLOTS 512
#define PIN_RANGES 14

struct pin_slot {
	int owner; /* the thread's tid; 0: free (atomic) */
	int depth; /* ranges in use (atomic) */
	uintptr_t lo[PIN_RANGES], hi[PIN_RANGES];
	uintptr_t alt_lo, alt_hi; /* the alternate signal stack */
} __attribute__((aligned(64)));

static struct pin_slot g_slots[PIN_SLOTS];
static int g_nslots; /* slots handed out: the helper reads these (atomic) */
static int g_all;    /* pins of everything in force (atomic) */
static TLS int t_slot; /* this thread's slot + 1 */

/* The eviction under way, the helper's: g_eseq odd while a batch runs,
 * its victims meanwhile in g_victims. */
static unsigned g_eseq;
static const struct rmem_evict_page *g_victims;
static uint32_t g_nvict;
static int g_waiters; /* threads waiting for the batch to end (atomic) */

static int gettid_raw(void) { return (int)rm_sys(SYS_gettid, 0, 0, 0); }

/* Whether thread tid of this process is gone. */
static int gone(int tid) { return rm_sys(SYS_tgkill, rm_sys(SYS_getpid, 0, 0, 0), tid, 0) == -ESRCH; }

/* A slot for this thread: a free one (the first), its owner its tid. */
static struct pin_slot *claim_slot(void)
{
	int tid = gettid_raw();
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < PIN_SLOTS; i++) {
			struct pin_slot *s = &g_slots[i];
			int free = 0;
			if (__atomic_load_n(&s->owner, __ATOMIC_RELAXED) ||
			    !__atomic_compare_exchange_n(&s->owner, &free, tid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
				continue;
			__atomic_store_n(&s->depth, 0, __ATOMIC_RELEASE);
			s->alt_lo = s->alt_hi = 0;
			int n = __atomic_load_n(&g_nslots, __ATOMIC_ACQUIRE);
			while (n <= i && !__atomic_compare_exchange_n(&g_nslots, &n, i + 1, 0, __ATOMIC_ACQ_REL,
								      __ATOMIC_ACQUIRE))
				;
			int had = __atomic_exchange_n(&t_slot, i + 1, __ATOMIC_ACQ_REL);
			if (had) { /* a signal handler claimed one meanwhile: keep that */
				__atomic_store_n(&s->owner, 0, __ATOMIC_RELEASE);
				t_slot = had;
				return &g_slots[had - 1];
			}
			return s;
		}
		/* Full: take back the slots of threads that are gone. */
		for (int i = 0; i < PIN_SLOTS; i++) {
			int o = __atomic_load_n(&g_slots[i].owner, __ATOMIC_ACQUIRE);
			if (o && gone(o)) {
				__atomic_store_n(&g_slots[i].depth, 0, __ATOMIC_RELEASE);
				__atomic_compare_exchange_n(&g_slots[i].owner, &o, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
			}
		}
	}
	return NULL;
}

static struct pin_slot *my_slot(void)
{
	int i = t_slot;
	return likely(i) ? &g_slots[i - 1] : claim_slot();
}

void rm_pin_begin(struct rm_pin *p)
{
	struct pin_slot *s = my_slot();
	p->slot = s ? (int)(s - g_slots) : -1;
	p->base = s ? __atomic_load_n(&s->depth, __ATOMIC_RELAXED) : 0;
	p->all = 0;
	if (!s)
		rm_pin_everything(p);
}

void rm_pin_everything(struct rm_pin *p)
{
	if (!p->all) {
		p->all = 1;
		__atomic_add_fetch(&g_all, 1, __ATOMIC_SEQ_CST);
	}
}

/* Adds [a, a+len) to p. The slot's ranges are a stack: the depth first
 * (a handler that interrupts us then takes the next one), then the range.
 * Past the slot's room, the last range grows to hold this one too. */
void rm_pin_range(struct rm_pin *p, const void *a, size_t len)
{
	if (!len || p->all)
		return;
	uintptr_t lo = (uintptr_t)a, hi = lo + len < lo ? UINTPTR_MAX : lo + len;
	struct pin_slot *s = &g_slots[p->slot];
	int d = __atomic_load_n(&s->depth, __ATOMIC_RELAXED);
	if (d >= PIN_RANGES) {
		if (d > p->base) { /* ours: widen it */
			if (lo < s->lo[d - 1])
				__atomic_store_n(&s->lo[d - 1], lo, __ATOMIC_RELAXED);
			if (hi > s->hi[d - 1])
				__atomic_store_n(&s->hi[d - 1], hi, __ATOMIC_RELAXED);
		} else {
			rm_pin_everything(p);
		}
		return;
	}
	__atomic_store_n(&s->depth, d + 1, __ATOMIC_RELAXED);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	__atomic_store_n(&s->lo[d], lo, __ATOMIC_RELAXED);
	__atomic_store_n(&s->hi[d], hi, __ATOMIC_RELAXED);
}

/* Whether the batch being evicted may take a page of p's ranges. */
static int batch_hits(const struct rm_pin *p)
{
	if (p->all)
		return 1;
	const struct rmem_evict_page *v = __atomic_load_n(&g_victims, __ATOMIC_ACQUIRE);
	uint32_t n = __atomic_load_n(&g_nvict, __ATOMIC_ACQUIRE);
	const struct pin_slot *s = &g_slots[p->slot];
	int d = __atomic_load_n(&s->depth, __ATOMIC_RELAXED);
	if (!v || n > RMEM_MAX_EVICT_BATCH || d > PIN_RANGES)
		return 1;
	for (int j = p->base; j < d; j++)
		for (uint32_t i = 0; i < n; i++)
			if (v[i].addr < s->hi[j] && v[i].addr + rm_page > s->lo[j])
				return 1;
	return 0;
}

/* Publishes p (the fence) and waits for a batch under way that did not
 * see it and may take one of its pages. Then the pages may be touched. */
void rm_pin_publish(struct rm_pin *p)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	unsigned e = __atomic_load_n(&g_eseq, __ATOMIC_ACQUIRE);
	if (likely(!(e & 1)))
		return;
	if (!batch_hits(p))
		return; /* (if e changed meanwhile, batch e is over: the next one sees p) */
	while (__atomic_load_n(&g_eseq, __ATOMIC_ACQUIRE) == e) {
		__atomic_add_fetch(&g_waiters, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&g_eseq, __ATOMIC_SEQ_CST) == e)
			rm_sys6(SYS_futex, (long)&g_eseq, FUTEX_WAIT_PRIVATE, e, 0, 0, 0);
		__atomic_sub_fetch(&g_waiters, 1, __ATOMIC_RELEASE);
	}
}

void rm_pin_end(struct rm_pin *p)
{
	if (p->slot >= 0)
		__atomic_store_n(&g_slots[p->slot].depth, p->base, __ATOMIC_RELEASE);
	if (p->all)
		__atomic_sub_fetch(&g_all, 1, __ATOMIC_RELEASE);
}

/* This thread's alternate signal stack is [a, a+len) from now on (len 0:
 * none), pinned while it is, and waits for a batch under way (which may
 * not have seen it): then its pages may be touched. Returns 0, or -1 when
 * the thread has no slot (then it is not pinned). */
int rm_pin_altstack(const void *a, size_t len)
{
	struct pin_slot *s = my_slot();
	if (!s)
		return -1;
	__atomic_store_n(&s->alt_hi, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->alt_lo, len ? (uintptr_t)a : 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->alt_hi, len ? (uintptr_t)a + len : 0, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	unsigned e = __atomic_load_n(&g_eseq, __ATOMIC_ACQUIRE);
	while ((e & 1) && __atomic_load_n(&g_eseq, __ATOMIC_ACQUIRE) == e) /* (rare: never mind which) */
		rm_sys(SYS_sched_yield, 0, 0, 0);
	return 0;
}

/* In a fork(3) child, the only thread: the parent's other threads' pins
 * are not its own; its own slot is its new tid's. */
void rm_pin_atfork_child(void)
{
	int mine = t_slot - 1, tid = gettid_raw();
	for (int i = 0; i < PIN_SLOTS; i++) {
		if (i == mine) {
			g_slots[i].owner = tid;
			continue;
		}
		g_slots[i].owner = 0;
		g_slots[i].depth = 0;
		g_slots[i].alt_lo = g_slots[i].alt_hi = 0;
	}
	g_all = 0;
	g_eseq &= ~1u;
	g_waiters = 0;
}

/* ---- the helper's side ---- */

/* Whether page v is in a range of slot s. */
static int pinned_in(const struct pin_slot *s, uintptr_t v)
{
	int d = __atomic_load_n(&s->depth, __ATOMIC_ACQUIRE);
	if (d > PIN_RANGES)
		d = PIN_RANGES;
	for (int j = 0; j < d; j++)
		if (v < __atomic_load_n(&s->hi[j], __ATOMIC_RELAXED) && v + rm_page > __atomic_load_n(&s->lo[j], __ATOMIC_RELAXED))
			return 1;
	uintptr_t alo = __atomic_load_n(&s->alt_lo, __ATOMIC_RELAXED), ahi = __atomic_load_n(&s->alt_hi, __ATOMIC_RELAXED);
	return v < ahi && v + rm_page > alo;
}

/* The helper, before it takes the n victims of an EVICT (v, kept until
 * rm_pin_evict_end): publishes them, then returns how many from the first
 * it may take: up to the first pinned one. */
uint32_t rm_pin_evict_begin(const struct rmem_evict_page *v, uint32_t n)
{
	__atomic_store_n(&g_victims, v, __ATOMIC_RELAXED);
	__atomic_store_n(&g_nvict, n, __ATOMIC_RELAXED);
	__atomic_store_n(&g_eseq, g_eseq + 1, __ATOMIC_SEQ_CST); /* odd */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&g_all, __ATOMIC_SEQ_CST))
		return 0;
	int ns = __atomic_load_n(&g_nslots, __ATOMIC_ACQUIRE);
	uint32_t k = n;
	for (int i = 0; i < ns; i++) {
		struct pin_slot *s = &g_slots[i];
		int o = __atomic_load_n(&s->owner, __ATOMIC_ACQUIRE);
		if (!o)
			continue;
		uint32_t first = k;
		for (uint32_t j = 0; j < first; j++)
			if (pinned_in(s, (uintptr_t)v[j].addr))
				first = j;
		if (first < k && gone(o)) { /* died inside a pinned call: its pins go */
			__atomic_store_n(&s->depth, 0, __ATOMIC_RELEASE);
			s->alt_lo = s->alt_hi = 0;
			__atomic_compare_exchange_n(&s->owner, &o, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
			continue;
		}
		k = first;
	}
	return k;
}

/* The batch is over: its pages are dropped, or kept. */
void rm_pin_evict_end(void)
{
	__atomic_store_n(&g_eseq, g_eseq + 1, __ATOMIC_SEQ_CST); /* even */
	if (__atomic_load_n(&g_waiters, __ATOMIC_SEQ_CST))
		rm_sys6(SYS_futex, (long)&g_eseq, FUTEX_WAKE_PRIVATE, 1 << 30, 0, 0, 0);
}

/* ---- touching ---- */

static inline void touch_write(uintptr_t q)
{
#if defined(__x86_64__)
	__asm__ volatile("lock; orb $0, %0" : "+m"(*(volatile char *)q) : : "memory");
#else
	__atomic_fetch_or((volatile char *)q, 0, __ATOMIC_RELAXED);
#endif
}

/* Makes the pages of [a, a+len) that lie in regions whose pages may all
 * be read and written present (write: writable too), from user mode, where
 * a missing page is served (ring mode's SIGBUS handler) and a write to a
 * write-protected one too: a read of a byte per page, or an atomic add of
 * 0 that keeps what another thread writes. Pages outside regions are left
 * alone (a file's page past its end would raise SIGBUS, a read-only one
 * SIGSEGV, where the kernel says EFAULT); so are those of regions with
 * pages mprotect-ed (R_NOTRW: which are, we do not know). Signal-safe. */
void rm_touch(const void *a, size_t len, int write)
{
	uintptr_t p = (uintptr_t)a, end = p + len < p ? UINTPTR_MAX : p + len;
	while (p < end) {
		uintptr_t stop;
		int flags, in = rm_table_span(p, &stop, &flags);
		if (in < 0)
			return;
		if (stop > end)
			stop = end;
		if (in && !(flags & R_NOTRW)) {
			for (uintptr_t q = p; q < stop; q = (q | (rm_page - 1)) + 1) {
				if (write)
					touch_write(q);
				else
					(void)*(volatile const char *)q;
				if (q > UINTPTR_MAX - rm_page)
					break;
			}
		}
		p = stop;
	}
}

/* ---- a call's buffers ---- */

void rm_bufs_add(struct rm_bufs *bs, uintptr_t p, size_t len, int write)
{
	if (!p || !len)
		return;
	if (bs->n == RM_MAX_BUFS) { /* the last one grows to hold this one too */
		uintptr_t lo = bs->b[RM_MAX_BUFS - 1].p, hi = lo + bs->b[RM_MAX_BUFS - 1].len, e = p + len;
		lo = p < lo ? p : lo;
		hi = e > hi ? e : hi;
		bs->b[RM_MAX_BUFS - 1].p = lo;
		bs->b[RM_MAX_BUFS - 1].len = hi - lo;
		bs->b[RM_MAX_BUFS - 1].write |= write;
		return;
	}
	bs->b[bs->n].p = p;
	bs->b[bs->n].len = len;
	bs->b[bs->n].write = write;
	bs->n++;
}

void rm_bufs_touch(const struct rm_bufs *bs)
{
	for (int i = 0; i < bs->n; i++)
		rm_touch((const void *)bs->b[i].p, bs->b[i].len, bs->b[i].write);
}

void rm_bufs_pin(struct rm_pin *pin, const struct rm_bufs *bs)
{
	rm_pin_begin(pin);
	for (int i = 0; i < bs->n; i++)
		rm_pin_range(pin, (const void *)bs->b[i].p, bs->b[i].len);
	rm_pin_publish(pin);
	rm_bufs_touch(bs);
}
