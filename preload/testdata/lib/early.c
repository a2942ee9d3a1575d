/* Forks with libearly.so's atfork handlers (see libearly.c), then checks and
 * frees what they allocated, in the child ("child ok") and in the parent,
 * which then gives the test a block the prepare handler made (glibc's)
 * and one the program made (the heap's) ("addrs"), and says "parent ok". */
#include "common.h"
#include <malloc.h>
#include <sys/wait.h>

extern char *early_pre_fork, *early_in_prepare, *early_in_parent, *early_in_child;

int main(void)
{
	early_pre_fork = malloc(1000);
	char *mine = malloc(5000);
	if (!early_pre_fork || !mine)
		die("malloc");
	fill(mine, 5000, 3);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	char *got = pid ? early_in_parent : early_in_prepare;
	if (!got || got[0] != 0x11 || got[(3 << 20) - 1] != 0x11 || early_pre_fork)
		die("what the prepare handler did");
	if (pid == 0) {
		if (!early_in_child || early_in_child[199])
			die("the child handler's calloc");
		free(early_in_child);
		got = realloc(got, 8 << 20);
		if (!got || got[(3 << 20) - 1] != 0x11 || !check(mine, 5000, 3))
			die("child memory");
		free(got);
		free(mine);
		say("child ok\n");
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
	printf("addrs %p %p\n", (void *)got, (void *)mine);
	fflush(stdout);
	if (malloc_usable_size(got) < (4 << 20) || !check(mine, 5000, 3))
		die("parent memory");
	free(got);
	free(mine);
	say("parent ok\n");
	return 0;
}
