/* A vfork() child shares its parent's memory, the shim's state with it:
 * mapping memory there (before exec, as some programs do) must leave the
 * parent's connection alone (it is the parent's, in the same address
 * space: the child is no child forked past fork(3) to drop it). Protocol
 * with the test: "ready" (evict), go; "ok" once the parent read its region
 * back and mapped a new one. */
#include "common.h"
#include <sys/mman.h>
#include <sys/wait.h>

int main(void)
{
	char *r = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED)
		die("mmap");
	fill(r, 2 * MiB, 1);
	pid_t pid = vfork();
	if (pid < 0)
		die("vfork");
	if (pid == 0) {
		void *q = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		_exit(q == MAP_FAILED);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("the vfork child");
	say("ready\n");
	wait_go();
	char *s = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s == MAP_FAILED)
		die("mmap after vfork");
	fill(s, 2 * MiB, 2);
	if (!check(r, 2 * MiB, 1) || !check(s, 2 * MiB, 2))
		die("memory after vfork");
	say("ok\n");
	return 0;
}
