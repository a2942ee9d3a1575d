/* The fault ring, the shim's side (pager/proto/ring.go has the protocol;
 * docs/pager.md, Misses in the faulting thread). In ring mode the uffd
 * raises SIGBUS in the thread that faults; its handler (sigbus.c) posts the
 * fault here and waits, in that thread, for the agent to map the page:
 * spinning a while, then in FUTEX_WAIT on the entry's state (a shared
 * futex: the page is the agent's too). No wake-up of another CPU's thread
 * when the agent is awake, no sleep in the kernel while the fault is
 * served.
 *
 * Everything on the posting side runs in a signal handler: atomics and
 * raw system calls only, nothing that could be held by the code it
 * interrupted, no allocation, no memory but the ring and the stack. A
 * handler interrupted by another signal whose handler faults posts a
 * second entry: nothing here is per thread.
 *
 * When the agent is lost for good (orphaned: resume.c), the helper thread
 * answers the ring in its place (rm_ring_serve_lost): every entry LOST,
 * its page poisoned, as the orphaned uffd poison loop answers uffd faults.
 *
 * The ring belongs to conn.c's connection (rm_conn_ring); this file owns
 * no state of its own. */
#include "rmem.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

#ifndef UFFDIO_POISON /* Linux 6.6; the headers may be older than the kernel */
struct uffdio_poison {
	struct uffdio_range range;
	__u64 mode;
	__s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, 0x08, struct uffdio_poison)
#endif

/* How long a faulting thread polls its entry before it sleeps on it. The
 * agent serves a miss over shm in ~10-15 us of its own time (DESIGN.md),
 * a thread that sleeps costs a wake-up of a halted vCPU (tens of us), and
 * a spinning thread costs only its own CPU, which has nothing else to do
 * for the program meanwhile: spin past the common service time, then
 * sleep (a miss that waits for the pool over tcp, or for room). Measured
 * under the test agent: see docs/pager.md. */
#define SPIN_NS 60000
static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t); /* (the vDSO's: async-signal-safe) */
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A FREE entry of r, claimed (FREE -> CLAIMED), from one that depends on
 * tid so that threads start apart. All busy (63 faults in flight): poll
 * again, yielding the CPU after a while. */
static struct rmem_ring_entry *claim(struct rmem_ring *r, uint32_t tid)
{
	for (unsigned round = 0;; round++) {
		for (unsigned k = 0; k < RMEM_RING_ENTRIES; k++) {
			struct rmem_ring_entry *e = &r->e[(tid + k) % RMEM_RING_ENTRIES];
			uint32_t s = RMEM_RING_FREE;
			if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) == RMEM_RING_FREE &&
			    __atomic_compare_exchange_n(&e->state, &s, RMEM_RING_CLAIMED, 0, __ATOMIC_ACQUIRE,
							__ATOMIC_RELAXED))
				return e;
		}
		if (round < 64)
			cpu_relax();
		else
			rm_sys(SYS_sched_yield, 0, 0, 0);
	}
}

static int waiting(uint32_t s) { return s == RMEM_RING_POSTED || s == RMEM_RING_SERVING; }

/* This thread's id, asked of the kernel once per thread: a system call
 * costs ~1 us on these VMs, a twentieth of a miss. A fork's child starts
 * afresh (rm_ring_atfork_child); a vfork child or a raw clone may post
 * with its parent's id, which only spreads the claims (the agent reads
 * no tid). */
static TLS uint32_t t_tid;

static uint32_t thread_id(void)
{
	if (!t_tid)
		t_tid = (uint32_t)rm_sys(SYS_gettid, 0, 0, 0);
	return t_tid;
}

void rm_ring_atfork_child(void) { t_tid = 0; }

/* Waits for e's result: polls it up to SPIN_NS from the post, then sleeps
 * on the state with waiters set (the agent stores the result, then wakes
 * if it sees waiters; we set waiters, then look at the state: one of the
 * two sees the other). While it polls, the thread yields its CPU at every
 * look: the miss is served by threads that need a CPU of their own (the
 * agent's loop, over tcp the memory server and the agent again for the
 * reply), and on two vCPUs one of them shares this one (perf sched: the
 * program's thread and the agent's loop took turns on one vCPU while the
 * memory server polled on the other; the kernel's EEVDF let a thread that
 * yielded only now and then run on for 8 us while the loop waited with
 * the reply). A yield with nobody else runnable here costs a system call
 * (random reads over tcp in ring mode, slow reads' p50: 31-32 us -> 26-29;
 * over shm unchanged, 8.6-9.5). A thread that stays runnable sees the
 * result at once; one asleep costs a wake-up of its CPU, and by then the
 * agent has stopped polling for its next fault: a thread that sleeps at
 * every miss keeps the agent asleep too (sleeping at once: 33-34 us). */
static uint32_t await_result(struct rmem_ring_entry *e, uint64_t posted)
{
	uint32_t s;
	for (unsigned n = 0;; n++) {
		s = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
		if (!waiting(s))
			return s;
		if ((n & 3) == 3 && now_ns() - posted > SPIN_NS)
			break;
		rm_sys(SYS_sched_yield, 0, 0, 0);
	}
	for (;;) {
		__atomic_store_n(&e->waiters, 1, __ATOMIC_SEQ_CST);
		s = __atomic_load_n(&e->state, __ATOMIC_SEQ_CST);
		if (!waiting(s))
			return s;
		rm_sys6(SYS_futex, (long)&e->state, FUTEX_WAIT, s, 0, 0, 0); /* shared: no PRIVATE flag */
	}
}

/* The faulting thread's side (its SIGBUS handler): posts the fault at addr
 * (write: the access was a write) and waits for its result. Returns
 * RMEM_RING_DONE (retry the access), RMEM_RING_LOST (the page is poisoned:
 * the program gets the SIGBUS of a lost page, sigbus.c), RMEM_RING_NOT_MINE
 * (not a fault of the pager's), or -1 when this process has no ring (the
 * fault is not the pager's either). Signal-safe. */
int rm_ring_fault(uintptr_t addr, int write)
{
	struct rmem_ring *r = rm_conn_ring();
	if (!r)
		return -1;
	uint32_t tid = thread_id();
	struct rmem_ring_entry *e = claim(r, tid);
	uint64_t posted = now_ns();
	e->waiters = 0;
	e->tid = tid;
	e->flags = write ? RMEM_RING_WRITE : 0;
	e->addr = addr;
	e->posted = posted;
	__atomic_store_n(&e->state, RMEM_RING_POSTED, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&r->posted, 1, __ATOMIC_RELAXED);
	/* The agent stores ASLEEP, then looks at the entries once more: it
	 * finds this post, or we see ASLEEP here and ring. */
	if (__atomic_load_n(&r->agent, __ATOMIC_SEQ_CST) == RMEM_RING_ASLEEP) {
		int db = rm_conn_doorbell();
		uint64_t one = 1;
		__atomic_add_fetch(&r->doorbells, 1, __ATOMIC_RELAXED);
		if (db >= 0)
			rm_sys(SYS_write, db, &one, sizeof one);
	}
	uint32_t s = await_result(e, posted);
	__atomic_store_n(&e->state, RMEM_RING_FREE, __ATOMIC_RELEASE);
	if (s == RMEM_RING_LOST || s == RMEM_RING_NOT_MINE)
		return (int)s;
	return RMEM_RING_DONE; /* (anything else: retry; a fault again posts again) */
}

/* ---- the helper thread, in the agent's place once orphaned ---- */

/* The answer to the fault at addr of an orphaned process: NOT_MINE outside
 * its regions; LOST with the page poisoned (no agent has its data; the
 * program gets the SIGBUS of a lost page: sigbus.c); DONE for a write to a
 * page that is here (poisoning fails: EEXIST, and mincore says resident;
 * a poisoned page is not): the agent had restored it
 * write-protected, to see it dirtied, and it is right: the write goes
 * through (as resume.c's poison loop does for uffd faults). */
static uint32_t answer_lost(int uffd, uintptr_t addr, int write)
{
	uintptr_t page = addr & ~(uintptr_t)(rm_page - 1);
	int flags;
	rm_table_lock();
	int mine = rm_table_covers_locked(page, rm_page, &flags, NULL);
	rm_table_unlock();
	if (!mine)
		return RMEM_RING_NOT_MINE;
	struct uffdio_poison p = {.range = {.start = page, .len = rm_page}};
	if (ioctl(uffd, UFFDIO_POISON, &p) == 0 || errno != EEXIST)
		return RMEM_RING_LOST; /* (no poison on this kernel: lost all the same) */
	/* Something is there: a page (written while protected) or the
	 * poison of an earlier answer. */
	unsigned char in = 0;
	if (write && mincore((void *)page, rm_page, &in) == 0 && (in & 1)) {
		struct uffdio_writeprotect wp = {.range = {.start = page, .len = rm_page}, .mode = 0};
		ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
		return RMEM_RING_DONE;
	}
	return RMEM_RING_LOST;
}

/* The helper thread, orphaned: answers every entry waiting in the ring
 * (posted, or taken by the agent that died: serving), and wakes its
 * thread. Returns how many it answered. */
int rm_ring_serve_lost(int uffd)
{
	struct rmem_ring *r = rm_conn_ring();
	int n = 0;
	if (!r)
		return 0;
	for (int i = 0; i < RMEM_RING_ENTRIES; i++) {
		struct rmem_ring_entry *e = &r->e[i];
		uint32_t s = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
		if (!waiting(s) ||
		    !__atomic_compare_exchange_n(&e->state, &s, RMEM_RING_SERVING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			continue;
		uint32_t res = answer_lost(uffd, (uintptr_t)e->addr, (e->flags & RMEM_RING_WRITE) != 0);
		__atomic_store_n(&e->state, res, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&e->waiters, __ATOMIC_SEQ_CST))
			rm_sys6(SYS_futex, (long)&e->state, FUTEX_WAKE, 1 << 30, 0, 0, 0);
		n++;
	}
	return n;
}

/* The helper, orphaned, about to sleep in poll(2) (asleep) or awake
 * again: says so in the ring's header, as the agent does, so that a post
 * rings the doorbell it polls. */
void rm_ring_agent_word(int asleep)
{
	struct rmem_ring *r = rm_conn_ring();
	if (r)
		__atomic_store_n(&r->agent, asleep ? RMEM_RING_ASLEEP : RMEM_RING_AWAKE, __ATOMIC_SEQ_CST);
}
