/* A child made with _Fork() (past fork(3)) never says HELLO. The shim
 * keeps regions out of such children (MADV_DONTFORK); this program undoes
 * that behind the shim's back, as a program may, so that the child
 * inherits the regions and a FORK event is raised: the agent serves them
 * through the uffd of that event alone, and must notice when it exits. Protocol with the test: "ready", go;
 * "child ok" once the child checked and rewrote the evicted memory and
 * exited; go; "parent ok". */
#include "common.h"
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define SIZE (8 * MiB)

int main(void)
{
	char *p = ready_heap(SIZE, 1);
	if (syscall(SYS_madvise, p, SIZE, MADV_DOFORK) != 0) /* p is page aligned */
		die("madvise");
	pid_t pid = _Fork();
	if (pid < 0)
		die("_Fork");
	if (pid == 0) {
		if (!check(p, SIZE, 1))
			die("child sees wrong contents");
		fill(p, SIZE, 2);
		if (!check(p, SIZE, 2))
			die("child lost its writes");
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
	say("child ok\n");
	wait_go();
	if (!check(p, SIZE, 1))
		die("parent sees the child's writes");
	free(p);
	say("parent ok\n");
	return 0;
}
