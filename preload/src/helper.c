/* The helper thread: the only reader of the agent socket. It hands the
 * program threads their replies and serves EVICT: copy each dirty victim
 * to its staging slot, then MADV_DONTNEED the victims, inside the process
 * (private-memory semantics hold, also across fork).
 *
 * It is created by our constructor, in every mode, and again in a forked
 * child by fork.c: creating a thread allocates (glibc callocs the new
 * thread's TLS vector through the malloc in front), which would deadlock
 * inside another allocator's mmap call (jemalloc holds its locks there).
 * It waits for conn.c to hand it a connection (rm_conn_await). This file
 * owns whether the process has its helper thread (rm_helper_running). */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static int g_running; /* the process has its helper thread (atomic) */

int rm_helper_running(void) { return __atomic_load_n(&g_running, __ATOMIC_ACQUIRE); }

/* In a fork child: threads do not survive fork. */
void rm_helper_atfork_child(void) { __atomic_store_n(&g_running, 0, __ATOMIC_RELEASE); }

/* Whether each victim that is to be copied (a dirty one, with a staging
 * slot) is resident (mincore, one call per run of neighbours with such a
 * victim; clean victims are dropped, not read): a victim that is not (an
 * agent that takes a dropped page for resident) would fault in the copy
 * below, and the fault waits for the agent, which waits for this batch. */
static void resident(const struct rmem_evict *ev, unsigned char *in)
{
	uint32_t i = 0;
	while (i < ev->n) {
		uintptr_t start = (uintptr_t)ev->pages[i].addr;
		uint32_t j = i + 1, copied = ev->pages[i].slot != RMEM_NO_SLOT;
		while (j < ev->n && (uintptr_t)ev->pages[j].addr == start + (j - i) * rm_page)
			copied |= ev->pages[j++].slot != RMEM_NO_SLOT;
		if (!copied)
			memset(in + i, 1, j - i);
		else if ((start & (rm_page - 1)) || mincore((void *)start, (j - i) * rm_page, in + i) != 0)
			memset(in + i, 0, j - i);
		for (uint32_t k = i; k < j; k++)
			in[k] &= 1;
		i = j;
	}
}

/* process_madvise(2)'s pidfd for the calling thread (PIDFD_SELF_THREAD,
 * Linux 6.14; its mm is the process's), and whether the kernel takes
 * MADV_DONTNEED through it: cleared at its first refusal, after which runs
 * are dropped one madvise(2) each. */
#define PIDFD_SELF_THREAD (-10000)
static int g_pmadv_ok = 1;

/* Drops the pages of the first n victims, which are sorted, one range per
 * run of neighbours, in one process_madvise call where the kernel has it:
 * one TLB flush for the batch instead of one per run (random victims make
 * runs of one or two pages, and each flush interrupts the program's
 * threads on the other CPUs). Returns how many victims, from the first,
 * were dropped; sets *err when not all. */
static uint32_t drop(const struct rmem_evict *ev, uint32_t n, int *err)
{
	struct iovec iov[RMEM_MAX_EVICT_BATCH];
	uint32_t first[RMEM_MAX_EVICT_BATCH]; /* the first victim of each run */
	int runs = 0;
	for (uint32_t i = 0; i < n;) {
		uintptr_t start = (uintptr_t)ev->pages[i].addr;
		uint32_t j = i + 1;
		while (j < n && (uintptr_t)ev->pages[j].addr == start + (j - i) * rm_page)
			j++;
		iov[runs] = (struct iovec){(void *)start, (j - i) * rm_page};
		first[runs++] = i;
		i = j;
	}
	if (runs > 1 && __atomic_load_n(&g_pmadv_ok, __ATOMIC_RELAXED)) {
		long r = rm_sys6(SYS_process_madvise, PIDFD_SELF_THREAD, (long)iov, runs, MADV_DONTNEED, 0, 0);
		if (r >= 0 && (size_t)r == (size_t)(n * rm_page))
			return n;
		if (r == -EBADF || r == -EINVAL || r == -ENOSYS || r == -EPERM)
			__atomic_store_n(&g_pmadv_ok, 0, __ATOMIC_RELAXED);
		/* Refused, or partly done: madvise from the first run again
		 * (dropping a dropped page again is harmless). */
	}
	for (int k = 0; k < runs; k++)
		if (rm_raw_madvise(iov[k].iov_base, iov[k].iov_len, MADV_DONTNEED) != 0) {
			*err = errno;
			return first[k];
		}
	return n;
}

/* Ring mode: write-protects the dirty victims of the first n (those with a
 * staging slot), one ioctl per run of neighbours, after the pins were
 * checked (pin.c): a write while we copy then faults (to the ring) and
 * waits for the EVICTED, and a pinned page is never protected here, where
 * a kernel write to it would fail with EFAULT. (The agent protects other
 * clients' dirty victims itself, before EVICT; a ring client's it leaves
 * to us: pager/evict.go's protectDirty.) */
static void protect(const struct rmem_evict *ev, uint32_t n)
{
	int uffd = rm_conn_uffd();
	for (uint32_t i = 0; i < n;) {
		if (ev->pages[i].slot == RMEM_NO_SLOT || (ev->pages[i].addr & (rm_page - 1))) {
			i++;
			continue;
		}
		uint32_t j = i + 1;
		while (j < n && ev->pages[j].slot != RMEM_NO_SLOT && ev->pages[j].addr == ev->pages[i].addr + (j - i) * rm_page)
			j++;
		struct uffdio_writeprotect wp = {
			.range = {.start = ev->pages[i].addr, .len = (j - i) * rm_page},
			.mode = UFFDIO_WRITEPROTECT_MODE_WP,
		};
		ioctl(uffd, UFFDIO_WRITEPROTECT, &wp); /* (refused: the range is being unmapped; checked below) */
		i = j;
	}
}

/* The number of victims of the first n before the first one in a shared
 * region (KIND_SHARED). The agent never evicts those (their pages are the
 * segment's, which it pages through the file, not through this process):
 * one that names such a page is refused as memory we cannot evict
 * (EFAULT), before anything is done to it (protect, MADV_DONTNEED, which
 * would drop only this process's view of the page). Preconditions:
 * table_mu held. */
static uint32_t before_shared(const struct rmem_evict *ev, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		int flags, kind;
		uintptr_t a = (uintptr_t)ev->pages[i].addr & ~(uintptr_t)(rm_page - 1);
		if (rm_table_covers_locked(a, rm_page, &flags, &kind) && kind == KIND_SHARED)
			return i;
	}
	return n;
}

/* Copies the victims into their staging slots and drops them. Runs under
 * table_mu so that no region goes away meanwhile (and an EVICT naming
 * memory we do not have, or a shared region's, is refused, not followed).
 * A victim of a region that may have inaccessible pages (R_UNREADABLE:
 * mprotect-ed) is read through /proc/self/mem, which reads such pages
 * without a signal: reading one directly would kill the process. In ring
 * mode, the victims from the first pinned one on are kept (EBUSY): a
 * system call has them in hand (pin.c). */
static void evict(const struct rmem_evict *ev, struct rmem_evicted *out)
{
	uint32_t done = 0, slots = rm_conn_slots(), n = ev->n;
	int err = 0, mem_fd = rm_conn_mem_fd(), ring = rm_ring_mode;
	char *staging = rm_conn_staging();
	unsigned char in[RMEM_MAX_EVICT_BATCH];
	if (ring && (n = rm_pin_evict_begin(ev->pages, ev->n)) < ev->n)
		err = EBUSY;
	rm_table_lock();
	uint32_t ok = before_shared(ev, n);
	if (ok < n) {
		n = ok;
		err = EFAULT;
	}
	if (ring)
		protect(ev, n);
	resident(ev, in);
	for (; done < n; done++) {
		uintptr_t a = (uintptr_t)ev->pages[done].addr;
		uint32_t s = ev->pages[done].slot;
		if ((a & (rm_page - 1)) || (s >= slots && s != RMEM_NO_SLOT)) {
			err = EINVAL;
			break;
		}
		int flags;
		if (!rm_table_covers_locked(a, rm_page, &flags, NULL)) {
			err = EFAULT;
			break;
		}
		if (s == RMEM_NO_SLOT)
			continue;
		if (!in[done]) {
			err = EFAULT; /* copying it would fault, and wait for the agent waiting for us */
			break;
		}
		char *dst = staging + (size_t)s * rm_page;
		if (!(flags & R_UNREADABLE)) {
			memcpy(dst, (void *)a, rm_page);
		} else if (mem_fd < 0 || rm_sys4(SYS_pread64, mem_fd, dst, rm_page, a) != (long)rm_page) {
			err = EFAULT; /* the agent keeps the page resident */
			break;
		}
	}
	/* Drop the pages (no REMOVE event: the shim does not ask for them). */
	done = drop(ev, done, &err);
	rm_table_unlock();
	if (ring)
		rm_pin_evict_end();
	out->batch = ev->batch;
	out->done = done;
	out->err = done < ev->n ? (uint32_t)err : 0;
}

/* Serves one connection until it ends. It must not allocate through the
 * shim (in_shim stays set) and runs with every signal blocked so that the
 * program's handlers never run on it. */
static void serve(int sock)
{
	static union {
		char buf[RMEM_MAX_PACKET];
		uint64_t align;
	} pkt;
	for (;;) {
		struct rmem_hdr h;
		int n = rm_recv(sock, pkt.buf, &h, NULL, NULL);
		if (n < 0) {
			rm_conn_lost(n == -EPROTO ? EPROTO : -n);
			return;
		}
		const char *body = pkt.buf + sizeof h;
		switch (h.type) {
		case RMEM_ACK:
			if (n != sizeof(struct rmem_ack))
				goto bad;
			rm_deliver_reply(((const struct rmem_ack *)body)->seq, 0);
			break;
		case RMEM_ERROR: {
			if (n < 8)
				goto bad;
			struct rmem_error e;
			memcpy(&e, body, 8);
			rm_deliver_reply(e.seq, e.err ? (int)e.err : EIO);
			break;
		}
		case RMEM_EVICT: {
			struct rmem_evict ev;
			if (n < 16)
				goto bad;
			memcpy(&ev, body, 16);
			if (ev.n == 0 || ev.n > RMEM_MAX_EVICT_BATCH || (size_t)n != 16 + ev.n * sizeof ev.pages[0])
				goto bad;
			memcpy(ev.pages, body + 16, ev.n * sizeof ev.pages[0]);
			struct rmem_evicted out;
			evict(&ev, &out);
			int err = rm_send(sock, RMEM_EVICTED, 0, &out, sizeof out, -1);
			if (err) {
				rm_conn_lost(-err);
				return;
			}
			break;
		}
		default:
			goto bad;
		}
		continue;
	bad:
		rm_conn_lost(EPROTO);
		shutdown(sock, SHUT_RDWR);
		return;
	}
}

static void *helper_main(void *arg)
{
	(void)arg;
	rm_shim_enter(); /* for good */
	for (;;) {
		int sock = rm_conn_await();
		for (;;) {
			serve(sock);
			if (rm_conn_state() != ST_RESUMING)
				break;
			rm_resume_loop(); /* until an agent resumes us */
			sock = rm_conn_sock();
		}
	}
	return NULL;
}

/* Starts the helper thread. Returns 0 or an errno. */
int rm_helper_start(void)
{
	sigset_t all, old;
	sigfillset(&all); /* (glibc's: without its internal signals, which setxid needs) */
	rm_sys4(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, _NSIG / 8);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 << 10);
	pthread_t t;
	int err = pthread_create(&t, &attr, helper_main, NULL);
	pthread_attr_destroy(&attr);
	rm_sys4(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, _NSIG / 8);
	if (!err)
		__atomic_store_n(&g_running, 1, __ATOMIC_RELEASE);
	return err;
}
