/* daemon() forks inside glibc, past the shim's fork() wrapper: the shim's
 * atfork handlers make the child a client of its own (never on its
 * parent's connection and uffd), and its allocations go to the agent. */
#include "common.h"

int main(void)
{
	char *p = malloc(2 * MiB);
	if (!p)
		die("malloc");
	fill(p, 2 * MiB, 1);
	say("ready\n");
	wait_go();
	if (daemon(1, 1) != 0)
		die("daemon");
	char *q = malloc(4 * MiB);
	if (!q)
		die("malloc in the child");
	fill(q, 4 * MiB, 2);
	if (!check(q, 4 * MiB, 2) || !check(p, 4096, 1))
		die("child memory");
	free(q);
	char line[64];
	snprintf(line, sizeof line, "child ok %d\n", (int)getpid());
	say(line);
	return 0; /* p stays: its munmap would wait for the agent (see doc.go) */
}
