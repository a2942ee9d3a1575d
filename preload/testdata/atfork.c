/* Other libraries' atfork handlers allocate and free big blocks while the
 * shim's fork() holds its locks: no deadlock, and the child still pairs. */
#include "common.h"
#include <pthread.h>
#include <sys/wait.h>

static char *victim;

static void churn(uint64_t seed)
{
	char *x = malloc(3 * MiB);
	if (!x)
		die("malloc in an atfork handler");
	fill(x, 3 * MiB, seed);
	if (!check(x, 3 * MiB, seed))
		die("atfork block");
	free(x);
}

static void prepare(void)
{
	churn(1);
	free(victim); /* a region allocated before the fork */
	victim = NULL;
}

static void parent(void) { churn(2); }
static void child(void) { churn(3); }

int main(void)
{
	char *keep = malloc(4 * MiB);
	victim = malloc(2 * MiB);
	if (!keep || !victim)
		die("malloc");
	fill(keep, 4 * MiB, 9);
	fill(victim, 2 * MiB, 10);
	if (pthread_atfork(prepare, parent, child))
		die("pthread_atfork");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (!check(keep, 4 * MiB, 9))
		die("contents after fork");
	churn(pid == 0 ? 5 : 4); /* a region after the fork, in each */
	if (pid == 0)
		_exit(0);
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
	free(keep);
	say("ok\n");
	return 0;
}
