/* A child made with _Fork() (past fork(3)) never says HELLO: the agent
 * serves its inherited regions through the uffd of its FORK event alone,
 * and must notice when it exits. Protocol with the test: "ready", go;
 * "child ok" once the child checked and rewrote the evicted memory and
 * exited; go; "parent ok". */
#include "common.h"
#include <sys/wait.h>

#define SIZE (8 * MiB)

int main(void)
{
	char *p = malloc(SIZE);
	if (!p)
		die("malloc");
	fill(p, SIZE, 1);
	say("ready\n");
	wait_go();
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
