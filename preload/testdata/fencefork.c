/* A fork of a process whose regions no uffd of its own holds: a child C
 * whose HELLO the agent refused (its regions are registered with the FORK
 * uffd the agent holds and does not serve) forks a grandchild G. G cannot
 * inherit the regions (copying them would raise a FORK event on a uffd
 * that nobody may read): their addresses are fenced (SIGSEGV), and in
 * glibc mode G has no heap and allocates from glibc. It must return from
 * fork() (jemalloc's child handler would read its arenas in the heap it
 * lacks), allocate, and unmap the fenced region without touching C's.
 *
 * A region R of 4 MiB (an mmap) and a malloc'd block H, resident.
 * Protocol with the test: "ready" (the agent then refuses HELLOs), go;
 * G says "grandchild allocates ok" and dies touching H; C says
 * "grandchild SIGxxx" and "child ok"; the parent "child exited N" and
 * "parent ok". */
#include "common.h"
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define SIZE (4 * MiB)

static void reap(pid_t pid, const char *who)
{
	int st;
	char line[96];
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	if (WIFSIGNALED(st))
		snprintf(line, sizeof line, "%s SIG%s\n", who, sigabbrev_np(WTERMSIG(st)) ? sigabbrev_np(WTERMSIG(st)) : "?");
	else
		snprintf(line, sizeof line, "%s exited %d\n", who, WEXITSTATUS(st));
	say(line);
}

int main(void)
{
	char *r = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *h = malloc(MiB);
	if (r == MAP_FAILED || !h)
		die("allocating");
	fill(r, SIZE, 1);
	fill(h, MiB, 3);
	say("ready\n");
	wait_go();
	pid_t c = fork();
	if (c < 0)
		die("fork");
	if (c == 0) {
		/* C: its resident pages read right; it allocates nothing (fresh
		 * pages of its regions would wait for an agent). */
		pid_t g = fork();
		if (g < 0)
			die("fork in the child");
		if (g == 0) {
			char *m = malloc(2 * MiB);
			if (!m)
				die("malloc in the grandchild");
			fill(m, 2 * MiB, 4);
			if (!check(m, 2 * MiB, 4))
				die("the grandchild's malloc'd memory");
			free(m);
			if (munmap(r, SIZE))
				die("munmap in the grandchild");
			say("grandchild allocates ok\n");
			(void)*(volatile char *)h; /* not inherited: SIGSEGV */
			say("FAIL: the grandchild read its parent's heap\n");
			_exit(1);
		}
		reap(g, "grandchild");
		if (!check(r, SIZE, 1) || !check(h, MiB, 3))
			die("the child's memory after its child's munmap");
		say("child ok\n");
		_exit(0);
	}
	reap(c, "child");
	if (!check(r, SIZE, 1) || !check(h, MiB, 3))
		die("the parent's memory");
	say("parent ok\n");
	return 0;
}
