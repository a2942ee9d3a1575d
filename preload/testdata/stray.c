/* daemon() forks inside glibc, past the shim's fork() wrapper: the shim's
 * atfork handlers make the child a client of its own (never on its
 * parent's connection and uffd), and its new memory goes to the agent (a
 * 4 MiB mmap: one region of its own, then a REGION_DEL). */
#include "common.h"
#include <sys/mman.h>

int main(void)
{
	char *p = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	fill(p, 2 * MiB, 1);
	say("ready\n");
	wait_go();
	if (daemon(1, 1) != 0)
		die("daemon");
	char *q = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED)
		die("mmap in the child");
	fill(q, 4 * MiB, 2);
	if (!check(q, 4 * MiB, 2) || !check(p, 4096, 1))
		die("child memory");
	munmap(q, 4 * MiB);
	char line[64];
	snprintf(line, sizeof line, "child ok %d\n", (int)getpid());
	say(line);
	return 0; /* p stays: its munmap would wait for the agent (see doc.go) */
}
