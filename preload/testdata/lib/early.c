/* Forks with libearly.so's atfork handlers (see libearly.c), then checks and
 * frees what they allocated, in the child ("child ok") and in the parent,
 * which then gives the test a block the prepare handler made (glibc's)
 * and one the program made (the heap's) ("addrs"), and says "parent ok". */
#include "common.h"
#include <malloc.h>
#include <sys/wait.h>

void early_hand_over(char *p);
int early_freed(void);
char *early_block(int parent);
char *early_child_block(void);

int main(void)
{
	char *handed = malloc(1000);
	char *mine = malloc(5000);
	if (!handed || !mine)
		die("malloc");
	early_hand_over(handed);
	fill(mine, 5000, 3);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	char *got = early_block(pid != 0);
	if (!got || got[0] != 0x11 || got[(3 << 20) - 1] != 0x11 || !early_freed())
		die("what the prepare handler did");
	if (pid == 0) {
		char *kid = early_child_block();
		if (!kid || kid[199])
			die("the child handler's calloc");
		free(kid);
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
