/* Writes, once orphaned, pages the agent restored write-protected (as the
 * pager restores a page read back: a write shows it dirtied). The page is
 * here and right: the write must go through, not wait forever (nor raise
 * SIGBUS). Protocol with the test: "ready <R>" (evict R), go; "read back"
 * (lose the agent for good), go; "written ok". */
#include "common.h"
#include <sys/mman.h>

#define SIZE (2 * MiB)

int main(void)
{
	char *r = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED)
		die("mmap");
	fill(r, SIZE, 1);
	char line[64];
	snprintf(line, sizeof line, "ready %p\n", (void *)r);
	say(line);
	wait_go();
	if (!check(r, SIZE, 1))
		die("read back");
	say("read back\n");
	wait_go();
	fill(r, SIZE, 2);
	if (!check(r, SIZE, 2))
		die("written");
	say("written ok\n");
	return 0;
}
