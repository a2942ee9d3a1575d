/* No EFAULT a program did not have before (ring mode), continued: the
 * calls that wait (poll, select, epoll, sleeps, signal waits), futexes,
 * and glibc's locks whose futex words live in the paged heap.
 *
 * As in kcall.c, each wrapper pins its arguments' memory, makes it present
 * from user mode, and calls glibc's function; the signal masks they take
 * leave SIGBUS out (sigwrap.c's rm_unbus). Retried after an EFAULT: poll,
 * ppoll, select, pselect, epoll_wait (level-triggered state, and epoll
 * puts back an event it could not copy), futex waits and wakes (an EFAULT
 * comes before anything is done). Not retried: the sleeps (an EFAULT on
 * the remaining time comes after the sleep) and the signal waits (the
 * signal is dequeued before its siginfo is copied).
 *
 * glibc's mutexes, condition variables, semaphores, rwlocks and barriers
 * sleep in futex(2) on a word of the object, which the program often
 * keeps in the paged heap: the kernel reads that word, and an EFAULT
 * there makes glibc abort ("The futex facility returned an unexpected
 * error code"). Their waits are wrapped: the object is pinned and made
 * present for the wait (a mutex only when its trylock fails: the common
 * uncontended lock costs one more branch). Their wakes need no page but
 * for process-shared objects (FUTEX_WAKE of a private futex reads no
 * memory): not wrapped, so a process-shared object in the paged heap
 * (shared across fork only) may miss a wake-up.
 *
 * syscall(3) is wrapped for SYS_futex, SYS_read, SYS_write, SYS_pread64,
 * SYS_pwrite64 and SYS_getdents64, and for SYS_rt_sigprocmask and
 * SYS_rt_sigaction (masks without SIGBUS; the program's SIGBUS
 * disposition recorded). */
#include "rmem.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <time.h>

int __poll_chk(struct pollfd *, nfds_t, int, size_t);
int __ppoll_chk(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *, size_t);

#define DECL(ret, name, ...)                                                   \
	typedef ret name##_fn(__VA_ARGS__);                                    \
	static name##_fn *real_##name
DECL(int, poll, struct pollfd *, nfds_t, int);
DECL(int, __poll_chk, struct pollfd *, nfds_t, int, size_t);
DECL(int, ppoll, struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
DECL(int, __ppoll_chk, struct pollfd *, nfds_t, const struct timespec *, const sigset_t *, size_t);
DECL(int, select, int, fd_set *, fd_set *, fd_set *, struct timeval *);
DECL(int, pselect, int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
DECL(int, epoll_wait, int, struct epoll_event *, int, int);
DECL(int, epoll_pwait, int, struct epoll_event *, int, int, const sigset_t *);
DECL(int, epoll_pwait2, int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
DECL(int, nanosleep, const struct timespec *, struct timespec *);
DECL(int, clock_nanosleep, clockid_t, int, const struct timespec *, struct timespec *);
DECL(int, sigtimedwait, const sigset_t *, siginfo_t *, const struct timespec *);
DECL(int, sigwaitinfo, const sigset_t *, siginfo_t *);
DECL(int, sigaltstack, const stack_t *, stack_t *);
DECL(int, pthread_mutex_lock, pthread_mutex_t *);
DECL(int, pthread_mutex_trylock, pthread_mutex_t *);
DECL(int, pthread_mutex_timedlock, pthread_mutex_t *, const struct timespec *);
DECL(int, pthread_cond_wait, pthread_cond_t *, pthread_mutex_t *);
DECL(int, pthread_cond_timedwait, pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
DECL(int, pthread_cond_clockwait, pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
DECL(int, sem_wait, sem_t *);
DECL(int, sem_timedwait, sem_t *, const struct timespec *);
DECL(int, pthread_rwlock_rdlock, pthread_rwlock_t *);
DECL(int, pthread_rwlock_wrlock, pthread_rwlock_t *);
DECL(int, pthread_rwlock_tryrdlock, pthread_rwlock_t *);
DECL(int, pthread_rwlock_trywrlock, pthread_rwlock_t *);
DECL(int, pthread_barrier_wait, pthread_barrier_t *);

__attribute__((constructor)) static void kwait_init(void)
{
	(void)RM_RESOLVE(poll), (void)RM_RESOLVE(__poll_chk), (void)RM_RESOLVE(ppoll), (void)RM_RESOLVE(__ppoll_chk);
	(void)RM_RESOLVE(select), (void)RM_RESOLVE(pselect);
	(void)RM_RESOLVE(epoll_wait), (void)RM_RESOLVE(epoll_pwait), (void)RM_RESOLVE(epoll_pwait2);
	(void)RM_RESOLVE(nanosleep), (void)RM_RESOLVE(clock_nanosleep), (void)RM_RESOLVE(sigtimedwait);
	(void)RM_RESOLVE(sigwaitinfo), (void)RM_RESOLVE(sigaltstack);
	(void)RM_RESOLVE(pthread_mutex_lock), (void)RM_RESOLVE(pthread_mutex_trylock), (void)RM_RESOLVE(pthread_mutex_timedlock);
	(void)RM_RESOLVE(pthread_cond_wait), (void)RM_RESOLVE(pthread_cond_timedwait), (void)RM_RESOLVE(pthread_cond_clockwait);
	(void)RM_RESOLVE(sem_wait), (void)RM_RESOLVE(sem_timedwait);
	(void)RM_RESOLVE(pthread_rwlock_rdlock), (void)RM_RESOLVE(pthread_rwlock_wrlock);
	(void)RM_RESOLVE(pthread_rwlock_tryrdlock), (void)RM_RESOLVE(pthread_rwlock_trywrlock);
	(void)RM_RESOLVE(pthread_barrier_wait);
}

/* ---- poll, select, epoll ---- */

EXPORT int poll(struct pollfd *fds, nfds_t n, int tmo)
{
	if (!rm_ring_call())
		return RM_RESOLVE(poll)(fds, n, tmo);
	struct rm_bufs m = {0};
	rm_add(&m, fds, n * sizeof *fds, 1);
	return RM_PINNED(&m, 1, real_poll(fds, n, tmo));
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int tmo, size_t fdslen)
{
	if (!rm_ring_call())
		return RM_RESOLVE(__poll_chk)(fds, n, tmo, fdslen);
	struct rm_bufs m = {0};
	rm_add(&m, fds, n * sizeof *fds < fdslen ? n * sizeof *fds : fdslen, 1);
	return RM_PINNED(&m, 1, real___poll_chk(fds, n, tmo, fdslen));
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask)
{
	sigset_t buf;
	mask = rm_unbus(mask, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(ppoll)(fds, n, tmo, mask);
	struct rm_bufs m = {0};
	rm_add(&m, fds, n * sizeof *fds, 1);
	rm_add(&m, tmo, sizeof *tmo, 0);
	rm_add(&m, mask, sizeof *mask, 0);
	return RM_PINNED(&m, 1, real_ppoll(fds, n, tmo, mask));
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask, size_t fdslen)
{
	sigset_t buf;
	mask = rm_unbus(mask, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(__ppoll_chk)(fds, n, tmo, mask, fdslen);
	struct rm_bufs m = {0};
	rm_add(&m, fds, n * sizeof *fds < fdslen ? n * sizeof *fds : fdslen, 1);
	rm_add(&m, tmo, sizeof *tmo, 0);
	rm_add(&m, mask, sizeof *mask, 0);
	return RM_PINNED(&m, 1, real___ppoll_chk(fds, n, tmo, mask, fdslen));
}

/* The fd_sets of nfds descriptors, and the timeout. */
static void select_mem(struct rm_bufs *m, int nfds, fd_set *r, fd_set *w, fd_set *e)
{
	size_t len = nfds > 0 ? ((size_t)nfds + 63) / 64 * 8 : 0;
	rm_add(m, r, len, 1);
	rm_add(m, w, len, 1);
	rm_add(m, e, len, 1);
}

EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
	if (!rm_ring_call())
		return RM_RESOLVE(select)(nfds, r, w, e, tv);
	struct rm_bufs m = {0};
	select_mem(&m, nfds, r, w, e);
	rm_add(&m, tv, sizeof *tv, 1);
	return RM_PINNED(&m, 1, real_select(nfds, r, w, e, tv));
}

EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts, const sigset_t *mask)
{
	sigset_t buf;
	mask = rm_unbus(mask, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(pselect)(nfds, r, w, e, ts, mask);
	struct rm_bufs m = {0};
	select_mem(&m, nfds, r, w, e);
	rm_add(&m, ts, sizeof *ts, 0); /* (the mask: read before the wait, from our stack or theirs) */
	return RM_PINNED(&m, 1, real_pselect(nfds, r, w, e, ts, mask));
}

EXPORT int epoll_wait(int ep, struct epoll_event *ev, int max, int tmo)
{
	if (!rm_ring_call())
		return RM_RESOLVE(epoll_wait)(ep, ev, max, tmo);
	struct rm_bufs m = {0};
	rm_add(&m, ev, max > 0 ? (size_t)max * sizeof *ev : 0, 1);
	return RM_PINNED(&m, 1, real_epoll_wait(ep, ev, max, tmo));
}

EXPORT int epoll_pwait(int ep, struct epoll_event *ev, int max, int tmo, const sigset_t *mask)
{
	sigset_t buf;
	mask = rm_unbus(mask, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(epoll_pwait)(ep, ev, max, tmo, mask);
	struct rm_bufs m = {0};
	rm_add(&m, ev, max > 0 ? (size_t)max * sizeof *ev : 0, 1);
	rm_add(&m, mask, sizeof *mask, 0);
	return RM_PINNED(&m, 1, real_epoll_pwait(ep, ev, max, tmo, mask));
}

EXPORT int epoll_pwait2(int ep, struct epoll_event *ev, int max, const struct timespec *tmo, const sigset_t *mask)
{
	sigset_t buf;
	mask = rm_unbus(mask, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(epoll_pwait2)(ep, ev, max, tmo, mask);
	struct rm_bufs m = {0};
	rm_add(&m, ev, max > 0 ? (size_t)max * sizeof *ev : 0, 1);
	rm_add(&m, tmo, sizeof *tmo, 0);
	rm_add(&m, mask, sizeof *mask, 0);
	return RM_PINNED(&m, 1, real_epoll_pwait2(ep, ev, max, tmo, mask));
}

/* ---- sleeps, signal waits, the alternate stack ---- */

EXPORT int nanosleep(const struct timespec *req, struct timespec *rem)
{
	if (!rm_ring_call())
		return RM_RESOLVE(nanosleep)(req, rem);
	struct rm_bufs m = {0};
	rm_add(&m, req, sizeof *req, 0);
	rm_add(&m, rem, sizeof *rem, 1);
	return RM_PINNED(&m, 0, real_nanosleep(req, rem));
}

EXPORT int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem)
{
	if (!rm_ring_call())
		return RM_RESOLVE(clock_nanosleep)(clk, flags, req, rem);
	struct rm_bufs m = {0};
	rm_add(&m, req, sizeof *req, 0);
	rm_add(&m, rem, sizeof *rem, 1);
	struct rm_pin pin;
	rm_bufs_pin(&pin, &m);
	int r = real_clock_nanosleep(clk, flags, req, rem);
	rm_pin_end(&pin);
	return r;
}

EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *tmo)
{
	sigset_t buf;
	set = rm_unbus(set, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(sigtimedwait)(set, info, tmo);
	struct rm_bufs m = {0};
	rm_add(&m, set, sizeof *set, 0);
	rm_add(&m, info, sizeof *info, 1);
	rm_add(&m, tmo, sizeof *tmo, 0);
	return RM_PINNED(&m, 0, real_sigtimedwait(set, info, tmo));
}

EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *info)
{
	sigset_t buf;
	set = rm_unbus(set, &buf);
	if (!rm_ring_call())
		return RM_RESOLVE(sigwaitinfo)(set, info);
	struct rm_bufs m = {0};
	rm_add(&m, set, sizeof *set, 0);
	rm_add(&m, info, sizeof *info, 1);
	return RM_PINNED(&m, 0, real_sigwaitinfo(set, info));
}

/* The kernel writes signal frames on the alternate stack: it is pinned for
 * as long as it is the thread's (pin.c) and made present and writable. */
EXPORT int sigaltstack(const stack_t *ss, stack_t *old)
{
	if (!rm_ring_call())
		return RM_RESOLVE(sigaltstack)(ss, old);
	struct rm_bufs m = {0};
	rm_add(&m, ss, sizeof *ss, 0);
	rm_add(&m, old, sizeof *old, 1);
	int r = RM_PINNED(&m, 1, real_sigaltstack(ss, old));
	if (r == 0 && ss) {
		int off = ss->ss_flags & SS_DISABLE;
		if (rm_pin_altstack(ss->ss_sp, off ? 0 : ss->ss_size) == 0 && !off)
			rm_touch(ss->ss_sp, ss->ss_size, 1);
	}
	return r;
}

/* ---- futexes: syscall(3) ---- */

/* The kernel's struct sigaction (x86-64, arm64: a 64-bit mask). */
struct ksigaction {
	void *handler;
	unsigned long flags;
	void *restorer;
	uint64_t mask;
};

static long sys_futex(long *a, int *err)
{
	int op = (int)a[1] & FUTEX_CMD_MASK;
	struct rm_bufs m = {0};
	int write = op == FUTEX_LOCK_PI || op == FUTEX_UNLOCK_PI || op == FUTEX_TRYLOCK_PI || op == FUTEX_LOCK_PI2 ||
		    op == FUTEX_WAIT_REQUEUE_PI || op == FUTEX_CMP_REQUEUE_PI;
	int retry = op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET || op == FUTEX_WAKE || op == FUTEX_WAKE_BITSET ||
		    op == FUTEX_REQUEUE || op == FUTEX_CMP_REQUEUE;
	rm_add(&m, a[0], sizeof(int), write);
	if (op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET || op == FUTEX_LOCK_PI || op == FUTEX_LOCK_PI2 ||
	    op == FUTEX_WAIT_REQUEUE_PI)
		rm_add(&m, a[3], sizeof(struct timespec), 0);
	if (op == FUTEX_REQUEUE || op == FUTEX_CMP_REQUEUE || op == FUTEX_WAKE_OP || op == FUTEX_CMP_REQUEUE_PI ||
	    op == FUTEX_WAIT_REQUEUE_PI)
		rm_add(&m, a[4], sizeof(int), op != FUTEX_REQUEUE && op != FUTEX_CMP_REQUEUE);
	struct rm_pin pin;
	rm_bufs_pin(&pin, &m);
	long r;
	for (int t = 0; (r = rm_sys6(SYS_futex, a[0], a[1], a[2], a[3], a[4], a[5])) == -EFAULT && retry && t < 3; t++)
		rm_bufs_touch(&m);
	rm_pin_end(&pin);
	*err = r < 0 ? (int)-r : 0;
	return r;
}

/* rt_sigaction(sig, act, old, size): SIGBUS's recorded (with our handler
 * installed), other signals' act without SIGBUS in their mask. */
static long sys_sigaction(long *a, int *err)
{
	const struct ksigaction *k = (const void *)a[1];
	struct ksigaction *ko = (void *)a[2], copy;
	if (a[0] == SIGBUS && rm_sigbus_installed() && a[3] == 8) {
		struct sigaction act, old;
		memset(&act, 0, sizeof act);
		if (k) {
			act.sa_handler = (sighandler_t)k->handler;
			act.sa_flags = (int)k->flags;
			act.sa_restorer = (void (*)(void))k->restorer;
			memcpy(&act.sa_mask, &k->mask, sizeof k->mask);
		}
		rm_sigbus_set(k ? &act : NULL, &old);
		if (ko) {
			ko->handler = (void *)old.sa_handler;
			ko->flags = (unsigned long)(unsigned)old.sa_flags;
			ko->restorer = (void *)old.sa_restorer;
			memcpy(&ko->mask, &old.sa_mask, sizeof ko->mask);
		}
		*err = 0;
		return 0;
	}
	if (k && rm_in_thread && (k->mask & (1ull << (SIGBUS - 1)))) {
		copy = *k;
		copy.mask &= ~(1ull << (SIGBUS - 1));
		k = &copy;
	}
	long r = rm_sys4(SYS_rt_sigaction, a[0], k, ko, a[3]);
	*err = r < 0 ? (int)-r : 0;
	return r;
}

/* read, pread64, getdents64 (the kernel writes a[1]), write, pwrite64 (it
 * reads a[1]): a[2] bytes; again after an EFAULT but for read. */
static long sys_buf(long n, long *a, int *err)
{
	int write = n == SYS_read || n == SYS_pread64 || n == SYS_getdents64;
	struct rm_bufs m = {0};
	rm_add(&m, a[1], (size_t)a[2], write);
	struct rm_pin pin;
	rm_bufs_pin(&pin, &m);
	long r;
	for (int t = 0; (r = rm_sys6(n, a[0], a[1], a[2], a[3], a[4], a[5])) == -EFAULT && n != SYS_read && t < 3; t++)
		rm_bufs_touch(&m);
	rm_pin_end(&pin);
	*err = r < 0 ? (int)-r : 0;
	return r;
}

EXPORT long syscall(long n, ...)
{
	long a[6];
	va_list ap;
	va_start(ap, n);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	long r;
	int err = 0;
	if (n == SYS_futex && rm_ring_call()) {
		r = sys_futex(a, &err);
	} else if ((n == SYS_read || n == SYS_pread64 || n == SYS_getdents64 || n == SYS_write || n == SYS_pwrite64) &&
		   rm_ring_call()) {
		r = sys_buf(n, a, &err);
	} else if (n == SYS_rt_sigaction && rm_in_thread) {
		r = sys_sigaction(a, &err);
	} else if (n == SYS_rt_sigprocmask && rm_in_thread && (a[0] == SIG_BLOCK || a[0] == SIG_SETMASK) && a[1] &&
		   a[3] == 8 && (*(const uint64_t *)a[1] & (1ull << (SIGBUS - 1)))) {
		uint64_t set = *(const uint64_t *)a[1] & ~(1ull << (SIGBUS - 1));
		r = rm_sys4(SYS_rt_sigprocmask, a[0], &set, a[2], a[3]);
		err = r < 0 ? (int)-r : 0;
	} else {
		r = rm_sys6(n, a[0], a[1], a[2], a[3], a[4], a[5]);
		err = r < 0 && r > -4096 ? (int)-r : 0;
	}
	if (err) {
		errno = err;
		return -1;
	}
	return r;
}

/* ---- glibc's locks ---- */

EXPORT int pthread_mutex_lock(pthread_mutex_t *mu)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_mutex_lock)(mu);
	int r = RM_RESOLVE(pthread_mutex_trylock)(mu);
	if (r != EBUSY)
		return r;
	struct rm_bufs m = {0};
	rm_add(&m, mu, sizeof *mu, 1);
	return RM_PINNED_ERR(&m, real_pthread_mutex_lock(mu));
}

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *mu, const struct timespec *at)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_mutex_timedlock)(mu, at);
	struct rm_bufs m = {0};
	rm_add(&m, mu, sizeof *mu, 1);
	rm_add(&m, at, sizeof *at, 0);
	return RM_PINNED_ERR(&m, real_pthread_mutex_timedlock(mu, at));
}

EXPORT int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *mu)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_cond_wait)(c, mu);
	struct rm_bufs m = {0};
	rm_add(&m, c, sizeof *c, 1);
	rm_add(&m, mu, sizeof *mu, 1);
	return RM_PINNED_ERR(&m, real_pthread_cond_wait(c, mu));
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *mu, const struct timespec *at)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_cond_timedwait)(c, mu, at);
	struct rm_bufs m = {0};
	rm_add(&m, c, sizeof *c, 1);
	rm_add(&m, mu, sizeof *mu, 1);
	rm_add(&m, at, sizeof *at, 0);
	return RM_PINNED_ERR(&m, real_pthread_cond_timedwait(c, mu, at));
}

EXPORT int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *mu, clockid_t clk, const struct timespec *at)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_cond_clockwait)(c, mu, clk, at);
	struct rm_bufs m = {0};
	rm_add(&m, c, sizeof *c, 1);
	rm_add(&m, mu, sizeof *mu, 1);
	rm_add(&m, at, sizeof *at, 0);
	return RM_PINNED_ERR(&m, real_pthread_cond_clockwait(c, mu, clk, at));
}

EXPORT int sem_wait(sem_t *s)
{
	if (!rm_ring_call())
		return RM_RESOLVE(sem_wait)(s);
	struct rm_bufs m = {0};
	rm_add(&m, s, sizeof *s, 1);
	return RM_PINNED(&m, 1, real_sem_wait(s));
}

EXPORT int sem_timedwait(sem_t *s, const struct timespec *at)
{
	if (!rm_ring_call())
		return RM_RESOLVE(sem_timedwait)(s, at);
	struct rm_bufs m = {0};
	rm_add(&m, s, sizeof *s, 1);
	rm_add(&m, at, sizeof *at, 0);
	return RM_PINNED(&m, 1, real_sem_timedwait(s, at));
}

EXPORT int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_rwlock_rdlock)(l);
	int r = RM_RESOLVE(pthread_rwlock_tryrdlock)(l);
	if (r != EBUSY)
		return r;
	struct rm_bufs m = {0};
	rm_add(&m, l, sizeof *l, 1);
	return RM_PINNED_ERR(&m, real_pthread_rwlock_rdlock(l));
}

EXPORT int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_rwlock_wrlock)(l);
	int r = RM_RESOLVE(pthread_rwlock_trywrlock)(l);
	if (r != EBUSY)
		return r;
	struct rm_bufs m = {0};
	rm_add(&m, l, sizeof *l, 1);
	return RM_PINNED_ERR(&m, real_pthread_rwlock_wrlock(l));
}

EXPORT int pthread_barrier_wait(pthread_barrier_t *b)
{
	if (!rm_ring_call())
		return RM_RESOLVE(pthread_barrier_wait)(b);
	struct rm_bufs m = {0};
	rm_add(&m, b, sizeof *b, 1);
	struct rm_pin pin;
	rm_bufs_pin(&pin, &m);
	int r = real_pthread_barrier_wait(b);
	rm_pin_end(&pin);
	return r;
}
