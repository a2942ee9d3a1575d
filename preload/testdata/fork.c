/* Parent and child write different values to the same evicted addresses
 * (and to pages resident and clean at the fork) and each reads its own. Protocol with the test: "ready" (evict the
 * parent), go; then each prints "P <pid>" / "C <pid>" after writing its
 * value (evict both), go (one byte each); each checks and prints. */
#include "common.h"
#include <sys/wait.h>

#define SIZE (16 * MiB)

int main(void)
{
	char *p = ready_heap(SIZE, 1);
	/* Read it all once: what is resident at the fork is then clean (in
	 * the pool too), so the child's first write to it must be seen. */
	if (!check(p, SIZE, 1))
		die("parent sees wrong contents before fork");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	int child = pid == 0;
	if (!check(p, SIZE, 1))
		die(child ? "child sees wrong contents after fork" : "parent sees wrong contents after fork");
	uint64_t mine = child ? 3 : 2;
	fill(p, SIZE, mine);
	char line[64];
	snprintf(line, sizeof line, "%c %d\n", child ? 'C' : 'P', (int)getpid());
	say(line);
	wait_go();
	if (!check(p, SIZE, mine))
		die(child ? "child reads the parent's writes" : "parent reads the child's writes");
	/* A new allocation in the child works too (its own uffd). */
	char *q = malloc(4 * MiB);
	fill(q, 4 * MiB, mine + 10);
	if (!check(q, 4 * MiB, mine + 10))
		die("allocation after fork");
	free(q);
	free(p);
	if (child) {
		say("child ok\n");
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
	say("parent ok\n");
	return 0;
}
