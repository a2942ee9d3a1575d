/* Signals stay the program's, and SIGBUS is never blocked (ring mode).
 *
 * In ring mode a page fault is a SIGBUS in the faulting thread, and a
 * synchronous SIGBUS that arrives while blocked kills the process (the
 * kernel resets it to the default). So every way a program blocks signals
 * through libc leaves SIGBUS out: sigprocmask, pthread_sigmask, the
 * sa_mask of every handler (sigaction), the masks of sigsuspend, pselect,
 * ppoll, epoll_pwait, epoll_pwait2, sigtimedwait, sigwaitinfo, sigwait,
 * posix_spawnattr_setsigmask, pthread_attr_setsigmask_np, and the old
 * BSD and System V calls (sigblock, sigsetmask, sighold, sigset with
 * SIG_HOLD). What the program asked for otherwise holds; a query of the
 * mask reports what the kernel has (SIGBUS unblocked). The ones with user
 * buffers (pselect, ppoll, epoll_pwait*, sigtimedwait, sigwaitinfo) are
 * kwait.c's, which strips their masks with rm_unbus.
 *
 * And the program's SIGBUS disposition is recorded behind our handler
 * (sigbus.c), never given to the kernel: sigaction, signal, bsd_signal,
 * sysv_signal, ssignal and sigset hand it over, so that a program that
 * installs its handler after us keeps paging. (Not seen: glibc's
 * sigignore, siginterrupt and BSD sigpause(mask), which call its internal
 * sigaction and sigsuspend; swapcontext and setcontext, which restore the
 * mask a context holds.)
 *
 * Outside ring mode (RMEM_IN_THREAD unset) everything passes through. A
 * program that blocks SIGBUS with a raw rt_sigprocmask system call (not
 * through libc) is not seen; syscall(SYS_rt_sigprocmask) is (kwait.c).
 * glibc's own blocking of all signals (posix_spawn's child,
 * pthread_create's window, its timer and aio helper threads) is not
 * either: spawn.c makes what those touch present first. */
#include "rmem.h"

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>

typedef int sigmask_fn(int, const sigset_t *, sigset_t *);
typedef int sigsuspend_fn(const sigset_t *);
typedef int sigwait_fn(const sigset_t *, int *);
typedef int spawnmask_fn(posix_spawnattr_t *, const sigset_t *);
typedef int attrmask_fn(pthread_attr_t *, const sigset_t *);

static sigmask_fn *real_sigprocmask, *real_pthread_sigmask;
static sigsuspend_fn *real_sigsuspend;
static sigwait_fn *real_sigwait;
static spawnmask_fn *real_spawnattr_setsigmask;
static attrmask_fn *real_attr_setsigmask;

/* Resolved by the constructor, before any signal handler of the program's
 * may call them (dlsym is not async-signal-safe). */
__attribute__((constructor)) static void sigwrap_init(void)
{
	RM_RESOLVE(sigprocmask);
	RM_RESOLVE(pthread_sigmask);
	RM_RESOLVE(sigsuspend);
	RM_RESOLVE(sigwait);
	RM_REAL(real_spawnattr_setsigmask, "posix_spawnattr_setsigmask");
	RM_REAL(real_attr_setsigmask, "pthread_attr_setsigmask_np");
}

/* set, or a copy of it in *buf without SIGBUS when ring mode may need it
 * (the program's set is never written). Signal-safe. */
const sigset_t *rm_unbus(const sigset_t *set, sigset_t *buf)
{
	if (!rm_in_thread || !set || sigismember(set, SIGBUS) != 1)
		return set;
	memcpy(buf, set, sizeof *buf);
	sigdelset(buf, SIGBUS);
	return buf;
}

static const sigset_t *unbus_how(int how, const sigset_t *set, sigset_t *buf)
{
	return how == SIG_UNBLOCK ? set : rm_unbus(set, buf);
}

EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
	sigset_t buf;
	if (!RM_RESOLVE(sigprocmask)) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigprocmask(how, unbus_how(how, set, &buf), old);
}

EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	sigset_t buf;
	if (!RM_RESOLVE(pthread_sigmask))
		return ENOSYS;
	return real_pthread_sigmask(how, unbus_how(how, set, &buf), old);
}

EXPORT int sigsuspend(const sigset_t *mask)
{
	sigset_t buf;
	if (!RM_RESOLVE(sigsuspend)) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigsuspend(rm_unbus(mask, &buf));
}

EXPORT int sigwait(const sigset_t *set, int *sig)
{
	sigset_t buf;
	if (!RM_RESOLVE(sigwait))
		return ENOSYS;
	return real_sigwait(rm_unbus(set, &buf), sig);
}

EXPORT int posix_spawnattr_setsigmask(posix_spawnattr_t *attr, const sigset_t *mask)
{
	sigset_t buf;
	if (!RM_REAL(real_spawnattr_setsigmask, "posix_spawnattr_setsigmask"))
		return ENOSYS;
	return real_spawnattr_setsigmask(attr, rm_unbus(mask, &buf));
}

EXPORT int pthread_attr_setsigmask_np(pthread_attr_t *attr, const sigset_t *mask)
{
	sigset_t buf;
	if (!RM_REAL(real_attr_setsigmask, "pthread_attr_setsigmask_np"))
		return ENOSYS;
	return real_attr_setsigmask(attr, rm_unbus(mask, &buf));
}

/* The BSD masks (an int of the first 32 signals): SIGBUS (7) left out. */
static int bsd_unbus(int mask) { return rm_in_thread ? mask & ~(1 << (SIGBUS - 1)) : mask; }

static int bsd_mask(int how, int mask)
{
	sigset_t set, old;
	sigemptyset(&set);
	for (int s = 1; s < 32; s++)
		if (mask & (1 << (s - 1)))
			sigaddset(&set, s);
	if (sigprocmask(how, &set, &old) != 0)
		return -1;
	int r = 0;
	for (int s = 1; s < 32; s++)
		if (sigismember(&old, s) == 1)
			r |= 1 << (s - 1);
	return r;
}

EXPORT int sigblock(int mask) { return bsd_mask(SIG_BLOCK, bsd_unbus(mask)); }
EXPORT int sigsetmask(int mask) { return bsd_mask(SIG_SETMASK, bsd_unbus(mask)); }

EXPORT int sighold(int sig)
{
	sigset_t set;
	sigemptyset(&set);
	if (sigaddset(&set, sig) != 0)
		return -1;
	return sigprocmask(SIG_BLOCK, &set, NULL);
}

/* ---- dispositions ---- */

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (sig == SIGBUS && rm_sigbus_installed()) {
		rm_sigbus_set(act, old);
		return 0;
	}
	struct sigaction a;
	if (act && rm_in_thread && sigismember(&act->sa_mask, SIGBUS) == 1) {
		a = *act;
		sigdelset(&a.sa_mask, SIGBUS);
		act = &a;
	}
	return rm_sigaction(sig, act, old);
}

/* signal(3) and its kin set a handler with these flags and mask (glibc's
 * choices); returns the old handler. */
static sighandler_t set_handler(int sig, sighandler_t h, int flags, int mask_self)
{
	struct sigaction a, old;
	memset(&a, 0, sizeof a);
	a.sa_handler = h;
	a.sa_flags = flags;
	sigemptyset(&a.sa_mask);
	if (mask_self && sig > 0 && sig < _NSIG)
		sigaddset(&a.sa_mask, sig);
	if (h == SIG_ERR || sig <= 0 || sig >= _NSIG || sigaction(sig, &a, &old) != 0) {
		errno = EINVAL;
		return SIG_ERR;
	}
	return old.sa_handler;
}

EXPORT sighandler_t signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART, 1); }
EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART, 1); }
EXPORT sighandler_t ssignal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART, 1); }

EXPORT sighandler_t sysv_signal(int sig, sighandler_t h)
{
	return set_handler(sig, h, SA_RESETHAND | SA_NODEFER, 0);
}

/* sigset(3): SIG_HOLD blocks the signal (never SIGBUS in ring mode), any
 * other disposition is set and the signal unblocked; returns SIG_HOLD if
 * it was blocked, else the old disposition. */
EXPORT sighandler_t sigset(int sig, sighandler_t h)
{
	sigset_t one, old;
	sigemptyset(&one);
	if (sig <= 0 || sig >= _NSIG || sigaddset(&one, sig) != 0) {
		errno = EINVAL;
		return SIG_ERR;
	}
	struct sigaction cur;
	if (sigaction(sig, NULL, &cur) != 0)
		return SIG_ERR;
	if (h == SIG_HOLD) {
		if (sigprocmask(SIG_BLOCK, &one, &old) != 0)
			return SIG_ERR;
		return sigismember(&old, sig) == 1 ? SIG_HOLD : cur.sa_handler;
	}
	sighandler_t prev = set_handler(sig, h, 0, 0);
	if (prev == SIG_ERR || sigprocmask(SIG_UNBLOCK, &one, &old) != 0)
		return SIG_ERR;
	return sigismember(&old, sig) == 1 ? SIG_HOLD : prev;
}
