/* A child made with _Fork() (past fork(3)): no atfork handler runs, so
 * nothing serves its regions. The shim keeps the pooled allocations out
 * of such children (MADV_DONTFORK): touching one raises SIGSEGV, never
 * reads zeros, and no FORK event is raised, so that the parent's next
 * fork(3) child is paired with its own. Protocol with the test: "ready",
 * go; "child SIGSEGV" (or "child exited <status>"); "parent ok";
 * "fork ok". */
#include "common.h"
#include <signal.h>
#include <sys/wait.h>

#define SIZE (8 * MiB)

static void reap(pid_t pid, const char *what)
{
	int st;
	char line[96];
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	if (WIFSIGNALED(st))
		snprintf(line, sizeof line, "%s %s\n", what, WTERMSIG(st) == SIGSEGV ? "SIGSEGV" : strsignal(WTERMSIG(st)));
	else
		snprintf(line, sizeof line, "%s exited %d\n", what, WEXITSTATUS(st));
	say(line);
}

int main(void)
{
	char *p = ready_heap(SIZE, 1);
	pid_t pid = _Fork();
	if (pid < 0)
		die("_Fork");
	if (pid == 0) {
		char *volatile q = malloc(2 * MiB); /* a call into the shim */
		free(q);
		volatile uint64_t sum = 0;
		for (size_t i = 0; i < SIZE; i += 4096)
			sum += *(volatile uint64_t *)(p + i);
		_exit(0);
	}
	reap(pid, "child");
	if (!check(p, SIZE, 1))
		die("the parent sees wrong contents");
	say("parent ok\n");
	/* A fork(3) after it: its child must get its own pages. */
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (!check(p, SIZE, 1))
			die("the fork(3) child sees wrong contents");
		fill(p, SIZE, 2);
		_exit(check(p, SIZE, 2) ? 0 : 1);
	}
	reap(pid, "fork");
	if (!check(p, SIZE, 1))
		die("the parent sees its child's writes");
	return 0;
}
