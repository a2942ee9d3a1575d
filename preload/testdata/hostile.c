/* Holds a region while the test sends bad commands; after the second go
 * byte the shim may have dropped the agent: new allocations must work. */
#include "common.h"

int main(void)
{
	char *p = malloc(2 * MiB);
	if (!p)
		die("malloc");
	fill(p, 2 * MiB, 7);
	char line[64];
	snprintf(line, sizeof line, "ready %p\n", (void *)p);
	say(line);
	wait_go();
	char *q = malloc(4 * MiB);
	if (!q)
		die("malloc after the agent was dropped");
	fill(q, 4 * MiB, 8);
	if (!check(q, 4 * MiB, 8))
		die("new allocation");
	free(q);
	say("ok\n");
	return 0;
}
