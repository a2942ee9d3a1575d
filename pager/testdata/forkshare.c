/* A fork that shares the pool: the child only reads its inherited heap
 * (as a snapshotting child would) while the parent, after the child has
 * read it, writes all of it anew. Protocol with the test: "ready", go;
 * "C read" once the child has checked every word; go (read by the parent
 * alone: the child waits on a pipe); "ok" once the parent has written and
 * checked its own, and the child checked again that it still reads the
 * parent's old contents. */
#include "common.h"
#include <sys/wait.h>

#define SIZE (16 * MiB)

int main(void)
{
	char *p = ready_heap(SIZE, 1);
	int fds[2];
	if (pipe(fds) != 0)
		die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(fds[1]);
		if (!check(p, SIZE, 1))
			die("the child sees wrong contents");
		say("C read\n");
		char c;
		if (read(fds[0], &c, 1) != 1)
			die("pipe closed");
		if (!check(p, SIZE, 1))
			die("the child sees the parent's writes");
		_exit(0);
	}
	close(fds[0]);
	wait_go();
	fill(p, SIZE, 2);
	if (!check(p, SIZE, 2))
		die("the parent lost its writes");
	if (write(fds[1], "g", 1) != 1)
		die("pipe");
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("the child failed");
	if (!check(p, SIZE, 2))
		die("the parent lost its writes after the child exited");
	say("ok\n");
	return 0;
}
