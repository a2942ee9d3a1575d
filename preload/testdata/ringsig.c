/* Ring mode keeps the program's signals (RMEM_IN_THREAD=1): its own
 * SIGBUS and SIGSEGV handlers, installed after the shim's, still run for
 * faults that are not the pager's (a file mapping past its end, a
 * PROT_NONE page), while paging goes on; SIGBUS is never blocked, so a
 * thread that blocks every signal, and the main thread with all of them
 * blocked (and SIGBUS held), read evicted pages (in today's mode too,
 * where the kernel serves them: SIGBUS blocked there); the default SIGBUS disposition (or an
 * ignored one) still kills on a real bus error. Protocol: "ready"; the
 * test evicts, sends "g"; "blocked main ok"; the test evicts, "g";
 * "blocked thread ok"; the test evicts, "g"; "ok". */
#include "common.h"
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define N (32 * MiB)

static char *A;
static sigjmp_buf jb;
static volatile sig_atomic_t caught, code, handled;

static void on_sig(int s, siginfo_t *si, void *uc)
{
	(void)uc;
	caught = s;
	code = si->si_code;
	siglongjmp(jb, 1);
}

static void on_plain(int s) { handled = s; }

static void *blocked(void *arg)
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	*(int *)arg = check(A, N, 5);
	return NULL;
}

/* A page past the end of a file mapping: SIGBUS, BUS_ADRERR. */
static char *past_eof(void)
{
	FILE *f = tmpfile();
	if (!f || ftruncate(fileno(f), 4096) != 0)
		die("tmpfile");
	char *m = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fileno(f), 0);
	if (m == MAP_FAILED)
		die("mmap");
	return m + 4096;
}

/* A child with SIGBUS set to disp touches a file past its end: it must die
 * of SIGBUS. */
static void child_dies(sighandler_t disp, const char *what)
{
	char *p = past_eof();
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGBUS, disp);
		volatile char x = *p;
		(void)x;
		_exit(0);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFSIGNALED(st) || WTERMSIG(st) != SIGBUS) {
		fprintf(stderr, "FAIL: a child with SIGBUS %s touching a file past its end: status %#x\n", what, st);
		exit(1);
	}
}

int main(void)
{
	int ring = getenv("RMEM_IN_THREAD") != NULL;
	A = malloc(N);
	if (!A)
		die("malloc");
	fill(A, N, 5);
	/* The program's handlers, installed after the shim's (which came
	 * with the connection, at the first allocation), sa_mask full. */
	struct sigaction sa, back;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_sig;
	sa.sa_flags = SA_SIGINFO;
	sigfillset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) != 0 || sigaction(SIGSEGV, &sa, NULL) != 0)
		die("sigaction");
	if (sigaction(SIGBUS, NULL, &back) != 0 || back.sa_sigaction != on_sig || !(back.sa_flags & SA_SIGINFO))
		die("sigaction(SIGBUS) did not give the program's handler back");
	say("ready\n");
	wait_go();

	sigset_t all, old, now;
	sigfillset(&all);
	if (sigprocmask(SIG_SETMASK, &all, &old) != 0)
		die("sigprocmask");
	if (!check(A, N, 5))
		die("the main thread, every signal blocked, read wrong data");
	sigprocmask(SIG_SETMASK, NULL, &now);
	if ((ring && sigismember(&now, SIGBUS)) || !sigismember(&now, SIGUSR1))
		die("the mask: SIGBUS blocked in ring mode, or SIGUSR1 not");
	sigprocmask(SIG_SETMASK, &old, NULL);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
	if (ring) /* (today's mode: holding it would make the next bus error kill) */
		sighold(SIGBUS); /* (old System V calls: programs still make them) */
	sigset(SIGUSR2, SIG_HOLD);
#pragma GCC diagnostic pop
	say("blocked main ok\n");
	wait_go();

	pthread_t t;
	int ok = 0;
	if (pthread_create(&t, NULL, blocked, &ok) != 0 || pthread_join(t, NULL) != 0 || !ok)
		die("a thread with every signal blocked read wrong data");
	say("blocked thread ok\n");
	wait_go();

	/* The program's SIGBUS handler, for a bus error that is not the
	 * pager's; its SIGSEGV handler for a PROT_NONE page. */
	char *p = past_eof();
	if (!sigsetjmp(jb, 1)) {
		volatile char x = *p;
		(void)x;
	}
	if (caught != SIGBUS || code != BUS_ADRERR)
		die("the program's SIGBUS handler did not run for a file mapping past its end");
	caught = 0;
	char *pn = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!sigsetjmp(jb, 1))
		pn[0] = 1;
	if (caught != SIGSEGV)
		die("the program's SIGSEGV handler did not run for a PROT_NONE page");
	/* kill(SIGBUS) goes to the program's handler too. */
	caught = 0;
	if (!sigsetjmp(jb, 1))
		kill(getpid(), SIGBUS);
	if (caught != SIGBUS || code != SI_USER)
		die("the program's SIGBUS handler did not run for kill(SIGBUS)");
	/* signal() gives the old handler back, and sets a plain one. */
	if ((void *)signal(SIGBUS, on_plain) != (void *)on_sig)
		die("signal(SIGBUS) did not return the program's handler");
	raise(SIGBUS);
	if (handled != SIGBUS)
		die("a handler set with signal(SIGBUS) did not run");
	child_dies(SIG_DFL, "default");
	child_dies(SIG_IGN, "ignored");
	/* All the while the pager's faults went on, and still do. */
	if (!check(A, N, 5))
		die("the heap after the program's signals");
	say("ok\n");
	return 0;
}
