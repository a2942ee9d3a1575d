/* A child made with _Fork() (past fork(3)) by a process without FORK
 * events (an ordinary user): nothing serves its regions, and its evicted
 * pages are missing. At its first call into the shim, the shim makes them
 * raise SIGBUS instead of reading as zeros. Protocol with the test:
 * "ready", go; "child SIGBUS" (or "child exited <status>"); "parent ok". */
#include "common.h"
#include <signal.h>
#include <sys/wait.h>

#define SIZE (8 * MiB)

int main(void)
{
	char *p = malloc(SIZE);
	if (!p)
		die("malloc");
	fill(p, SIZE, 1);
	say("ready\n");
	wait_go();
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
	int st;
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	char line[64];
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS)
		snprintf(line, sizeof line, "child SIGBUS\n");
	else
		snprintf(line, sizeof line, "child exited %d\n", st);
	say(line);
	if (!check(p, SIZE, 1))
		die("the parent sees wrong contents");
	say("parent ok\n");
	return 0;
}
