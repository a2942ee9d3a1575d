/* The SIGBUS handler of ring mode, and the program's own SIGBUS
 * disposition behind it.
 *
 * In ring mode the uffd raises SIGBUS (BUS_ADRERR) in the thread whose
 * access missed a page of a region, or wrote a write-protected one. The
 * handler posts the fault to the fault ring (ring.c) and returns when the
 * agent answered: DONE, the access is retried; LOST, the page was poisoned
 * and the program hears of it (its disposition, with BUS_MCEERR_AR): a
 * retried access would fault again with BUS_ADRERR on kernels without
 * CONFIG_MEMORY_FAILURE, such as these. Every SIGBUS that is not the pager's (NOT_MINE, no ring, a
 * poisoned page, a file mapping past its end, one sent by kill) goes to the
 * program's own disposition: its handler, called as it asked (SA_SIGINFO
 * or not, its sa_mask blocked meanwhile, SA_RESETHAND), or the default
 * (restored, and the re-fault kills as it would have), or ignored.
 *
 * The program's disposition is recorded here, not given to the kernel:
 * sigwrap.c's sigaction, signal, sigset, bsd_signal and sysv_signal hand
 * it over (rm_sigbus_set) and get the old one back, so that a program that
 * installs its handler after us (the JVM does) keeps paging.
 *
 * The handler is installed with SA_SIGINFO | SA_NODEFER, and sa_mask
 * empty: SIGBUS stays unblocked while it runs, because a synchronous
 * SIGBUS that arrives blocked kills the process; the program's handler it
 * calls may itself touch a page in the pool (the JVM's does), a signal
 * handler that interrupts ours may too. Nothing here blocks while it
 * holds anything: the handler may run inside any code, a nested one
 * included. SA_ONSTACK and SA_RESTART follow the program's.
 *
 * Async-signal-safe: atomics, raw system calls; the record is read under a
 * generation counter (two copies, the writer fills the one not in use),
 * never a lock. */
#include "rmem.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int sigaction_fn(int, const struct sigaction *, struct sigaction *);

static sigaction_fn *real_sigaction;

/* The program's disposition: two copies, rec[cur] the one in use; a
 * writer fills the other (gen odd meanwhile), then flips cur. */
static struct {
	unsigned gen; /* odd while written */
	unsigned id;  /* which write this is (g_writes) */
	struct sigaction act;
} g_rec[2];
static unsigned g_writes;
static int g_cur;
static int g_wlock;      /* one writer at a time (a spin lock: never held across a call) */
static int g_installed;  /* our handler is the kernel's (atomic) */
static pid_t g_pid;      /* the process that installed it (a vfork child is not) */
static unsigned g_reset; /* the record (id) whose SA_RESETHAND handler ran: the default since */

/* The program's disposition; *id: which record it is. */
static void rec_read(struct sigaction *out, unsigned *id)
{
	for (;;) {
		int i = __atomic_load_n(&g_cur, __ATOMIC_ACQUIRE);
		unsigned g1 = __atomic_load_n(&g_rec[i].gen, __ATOMIC_ACQUIRE);
		unsigned rid = g_rec[i].id;
		memcpy(out, &g_rec[i].act, sizeof *out);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		unsigned g2 = __atomic_load_n(&g_rec[i].gen, __ATOMIC_RELAXED);
		if (g1 != g2 || (g1 & 1))
			continue; /* being written (by another thread: we never interrupt our own writer's copy) */
		if (id)
			*id = rid;
		if (rid == __atomic_load_n(&g_reset, __ATOMIC_ACQUIRE)) {
			memset(out, 0, sizeof *out); /* its SA_RESETHAND handler ran: the default */
			out->sa_handler = SIG_DFL;
		}
		return;
	}
}

/* Preconditions: g_wlock held. */
static void rec_write(const struct sigaction *act)
{
	int next = 1 - __atomic_load_n(&g_cur, __ATOMIC_RELAXED);
	__atomic_add_fetch(&g_rec[next].gen, 1, __ATOMIC_ACQ_REL);
	g_rec[next].id = ++g_writes;
	memcpy(&g_rec[next].act, act, sizeof *act);
	sigdelset(&g_rec[next].act.sa_mask, SIGBUS);
	__atomic_add_fetch(&g_rec[next].gen, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&g_cur, next, __ATOMIC_RELEASE);
}

static void wlock(void)
{
	while (__atomic_exchange_n(&g_wlock, 1, __ATOMIC_ACQUIRE))
		rm_sys(SYS_sched_yield, 0, 0, 0);
}

static void wunlock(void) { __atomic_store_n(&g_wlock, 0, __ATOMIC_RELEASE); }

static void on_sigbus(int sig, siginfo_t *si, void *uc);

/* Gives the kernel our handler, with the program's SA_ONSTACK and
 * SA_RESTART. */
static int kernel_install(int prog_flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | (prog_flags & (SA_ONSTACK | SA_RESTART));
	sigemptyset(&sa.sa_mask);
	return real_sigaction(SIGBUS, &sa, NULL);
}

/* Installs the handler (region.c, when the connection is made in ring
 * mode; idempotent): what the kernel had for SIGBUS becomes the program's
 * disposition. Returns 0 or -errno (then the process cannot page in ring
 * mode). */
int rm_sigbus_install(void)
{
	if (__atomic_load_n(&g_installed, __ATOMIC_ACQUIRE))
		return 0;
	if (!real_sigaction)
		real_sigaction = (sigaction_fn *)rm_libc("sigaction");
	if (!real_sigaction)
		return -ENOSYS;
	wlock();
	int err = 0;
	if (!g_installed) {
		struct sigaction old;
		if (real_sigaction(SIGBUS, NULL, &old) != 0 || kernel_install(old.sa_flags) != 0) {
			err = -errno;
		} else {
			rec_write(&old);
			g_pid = getpid();
			__atomic_store_n(&g_installed, 1, __ATOMIC_RELEASE);
		}
	}
	wunlock();
	return err;
}

/* Whether the handler is installed and this process's own: a vfork child
 * (sharing our memory, not our dispositions) is not its owner. */
int rm_sigbus_owned(void) { return __atomic_load_n(&g_installed, __ATOMIC_ACQUIRE) && getpid() == g_pid; }

int rm_sigbus_installed(void) { return __atomic_load_n(&g_installed, __ATOMIC_ACQUIRE); }

/* In a fork(3) child: the disposition is its own now (a copy). */
void rm_sigbus_atfork_child(void) { g_pid = getpid(); }

/* glibc's sigaction, for sigwrap.c's calls for other signals. */
int rm_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (!real_sigaction)
		real_sigaction = (sigaction_fn *)rm_libc("sigaction");
	if (!real_sigaction) {
		errno = ENOSYS;
		return -1;
	}
	return real_sigaction(sig, act, old);
}

/* The program sets (act) or asks for (old) its SIGBUS disposition, with
 * our handler installed: recorded, never the kernel's. A vfork child's
 * (rm_sigbus_owned false: CPython's, resetting handlers before exec) is
 * answered and dropped: it shares our record, and its faults need our
 * handler until it execs. */
void rm_sigbus_set(const struct sigaction *act, struct sigaction *old)
{
	if (old)
		rec_read(old, NULL);
	if (!act || !rm_sigbus_owned())
		return;
	wlock();
	struct sigaction cur;
	rec_read(&cur, NULL);
	rec_write(act);
	if ((cur.sa_flags ^ act->sa_flags) & (SA_ONSTACK | SA_RESTART))
		kernel_install(act->sa_flags);
	wunlock();
}

/* A SIGBUS that is not the pager's, to the program's disposition. */
static void chain(int sig, siginfo_t *si, void *uc)
{
	struct sigaction a;
	unsigned id;
	rec_read(&a, &id);
	void (*h)(int) = a.sa_handler;
	int kernel_sent = si->si_code > 0; /* a fault, not kill or sigqueue */
	if (!(a.sa_flags & SA_SIGINFO) && (h == SIG_DFL || (h == SIG_IGN && kernel_sent))) {
		/* The default, as the kernel would apply it: restored, then a
		 * fault is taken again and kills; a signal that was sent is
		 * raised again. (A fault ignored is a fault that kills.) */
		struct sigaction dfl;
		memset(&dfl, 0, sizeof dfl);
		dfl.sa_handler = SIG_DFL;
		real_sigaction(SIGBUS, &dfl, NULL);
		if (!kernel_sent)
			rm_sys(SYS_tgkill, getpid(), rm_sys(SYS_gettid, 0, 0, 0), SIGBUS);
		return;
	}
	if (!(a.sa_flags & SA_SIGINFO) && h == SIG_IGN)
		return;
	if (a.sa_flags & SA_RESETHAND) /* once: the default from now on */
		__atomic_store_n(&g_reset, id, __ATOMIC_RELEASE);
	sigset_t old;
	int masked = 0;
	for (int s = 1; s < _NSIG && !masked; s++)
		masked = s != SIGBUS && sigismember(&a.sa_mask, s) == 1;
	if (masked) /* the program's sa_mask, while its handler runs */
		rm_sys4(SYS_rt_sigprocmask, SIG_BLOCK, &a.sa_mask, &old, _NSIG / 8);
	if (a.sa_flags & SA_SIGINFO)
		a.sa_sigaction(sig, si, uc);
	else
		h(sig);
	if (masked)
		rm_sys4(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, _NSIG / 8);
}

/* Whether the access that faulted was a write: the page-fault error code
 * in the signal's context (x86-64); elsewhere the agent is told a write,
 * which it handles either way (a read of a missing page served writable
 * is served). */
static int fault_write(void *ucv)
{
#if defined(__x86_64__)
	const ucontext_t *uc = ucv;
	return (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
	(void)ucv;
	return 1;
#endif
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	int e = errno;
	if (si->si_code == BUS_ADRERR) {
		int r = rm_ring_fault((uintptr_t)si->si_addr, fault_write(uc));
		if (r == RMEM_RING_DONE) {
			errno = e;
			return;
		}
		if (r == RMEM_RING_LOST) {
			/* The page is poisoned. Where the kernel has
			 * CONFIG_MEMORY_FAILURE the retried access would raise
			 * BUS_MCEERR_AR; without it (these machines) a
			 * poisoned page raises BUS_ADRERR, as a missing one
			 * does, and would come back here for good. So the
			 * program hears of it now, as of a lost page. */
			siginfo_t lost = *si;
			lost.si_code = BUS_MCEERR_AR;
			lost.si_addr_lsb = (short)__builtin_ctzl(rm_page);
			chain(sig, &lost, uc);
			errno = e;
			return;
		}
	}
	chain(sig, si, uc);
	errno = e;
}
