/* exec under the shim: the program allocates, then execs itself with
 * "child"; the new image is a new client of the agent (its own HELLO,
 * its own heap), allocates and checks, says "child ok". */
#include "common.h"

int main(int argc, char **argv)
{
	int child = argc > 1 && !strcmp(argv[1], "child");
	size_t n = child ? 100000 : 50000;
	uint64_t **b = malloc(n * sizeof *b);
	if (!b)
		die("malloc");
	for (size_t i = 0; i < n; i++) {
		if (!(b[i] = malloc(48)))
			die("malloc");
		fill(b[i], 48, i);
	}
	char *big = malloc(16 * MiB);
	if (!big)
		die("malloc");
	fill(big, 16 * MiB, child);
	for (size_t i = 0; i < n; i++)
		if (!check(b[i], 48, i))
			die("a small block");
	if (!check(big, 16 * MiB, child))
		die("the big block");
	if (child) {
		say("child ok\n");
		return 0;
	}
	say("ready\n");
	wait_go();
	char *args[] = {argv[0], "child", NULL};
	execv(argv[0], args);
	die("execv");
}
