/* Unmaps a region right after fork(), in the parent and in the child:
 * the parent's REGION_DEL reaches the agent as soon as fork() returned,
 * the child's after its HELLO, and the agent must have copied the region
 * for the child from the FORK event first. "ok". */
#include "common.h"
#include <sys/mman.h>
#include <sys/wait.h>

int main(void)
{
	char *p = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *q = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || q == MAP_FAILED)
		die("mmap");
	fill(p, 2 * MiB, 1);
	fill(q, 2 * MiB, 2);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (munmap(p, 2 * MiB))
		die("munmap");
	if (!check(q, 2 * MiB, 2))
		die("contents after fork");
	if (pid == 0)
		_exit(0);
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
	say("ok\n");
	return 0;
}
