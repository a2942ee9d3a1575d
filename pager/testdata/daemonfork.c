/* A process made by glibc's daemon(), which forks inside the C library:
 * not through fork(3), so not through the shim's fork() wrapper, but
 * through its atfork handlers. The daemon must read its parent's pooled
 * pages (with FORK events, served from the event's uffd; without, from
 * the copy the prepare handler's FORK_PREPARE made), and be a paged
 * client of its own: it forks again with fork(3), and each process reads
 * back its own writes. Protocol with the test: "ready", go;
 * "daemon ok <pid>" from the daemon (the program itself exits 0 inside
 * daemon()). */
#include "common.h"
#include <sys/wait.h>

#define SIZE (16 * MiB)
#define HALF (SIZE / 2)

static int both(const char *p, uint64_t lo, uint64_t hi)
{
	return check(p, HALF, lo) && check(p + HALF, HALF, hi);
}

int main(void)
{
	char *p = malloc(SIZE);
	if (!p)
		die("malloc");
	fill(p, HALF, 1);
	fill(p + HALF, HALF, 11);
	say("ready\n");
	wait_go();
	if (daemon(1, 1) != 0) /* keeps the cwd and stdin, stdout, stderr */
		die("daemon");
	if (!both(p, 1, 11))
		die("the daemon sees wrong contents");
	fill(p, HALF, 2);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (!both(p, 2, 11))
			die("the daemon's child sees wrong contents");
		fill(p, HALF, 3);
		fill(p + HALF, HALF, 13);
		if (!both(p, 3, 13))
			die("the daemon's child lost its own writes");
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("the daemon's child failed");
	if (!both(p, 2, 11))
		die("the daemon sees its child's writes, or lost its own");
	char line[64];
	snprintf(line, sizeof line, "daemon ok %d\n", (int)getpid());
	say(line);
	return 0;
}
