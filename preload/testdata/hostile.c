/* Holds a region (a 2 MiB mmap, so that its bounds are known to the
 * test; its last page dropped) while the test sends bad commands; after
 * the second go byte the shim may have dropped the agent: new memory must
 * work. */
#include "common.h"
#include <sys/mman.h>

int main(void)
{
	char *p = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	fill(p, 2 * MiB, 7);
	/* Its last page is not resident: an EVICT of it is refused. */
	if (madvise(p + 2 * MiB - 4096, 4096, MADV_DONTNEED))
		die("madvise");
	char line[64];
	snprintf(line, sizeof line, "ready %p\n", (void *)p);
	say(line);
	wait_go();
	char *q = malloc(4 * MiB);
	if (!q)
		die("malloc after the agent was dropped");
	fill(q, 4 * MiB, 8);
	if (!check(q, 4 * MiB, 8) || !check(p, 2 * MiB - 4096, 7))
		die("memory after the agent was dropped");
	free(q);
	say("ok\n");
	return 0;
}
