/* Forks while other threads allocate and free without pause, small and
 * big blocks (the allocator maps, purges and unmaps meanwhile, and the
 * shim talks to the agent for it): a fork must take the allocator's locks
 * and the shim's in an order no allocating thread can deadlock with, and
 * each child must find the heap whole. 3 threads, 40 forks (or
 * $FORKSTRESS_FORKS); each child allocates, checks a block its parent
 * filled and exits 0; "ok". */
#include "common.h"
#include <pthread.h>
#include <sys/wait.h>

#define HOLD 64

static volatile int stop;
static char *shared;

static void *churn(void *arg)
{
	uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
	char *held[HOLD] = {0};
	size_t len[HOLD] = {0};
	while (!stop) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		int i = (int)(x % HOLD);
		if (held[i]) {
			if (held[i][0] != (char)i || held[i][len[i] - 1] != (char)i)
				die("a block changed");
			free(held[i]);
		}
		len[i] = (x >> 8) % 8 == 0 ? (x >> 16) % (4 * MiB) + 1 : (x >> 16) % 2000 + 1;
		if (!(held[i] = malloc(len[i])))
			die("malloc");
		held[i][0] = held[i][len[i] - 1] = (char)i;
	}
	for (int i = 0; i < HOLD; i++)
		free(held[i]);
	return NULL;
}

int main(void)
{
	shared = malloc(8 * MiB);
	if (!shared)
		die("malloc");
	fill(shared, 8 * MiB, 5);
	pthread_t t[3];
	for (uintptr_t i = 0; i < 3; i++)
		if (pthread_create(&t[i], NULL, churn, (void *)(i + 1)))
			die("pthread_create");
	const char *env = getenv("FORKSTRESS_FORKS");
	int forks = env ? atoi(env) : 40;
	for (int k = 0; k < forks; k++) {
		usleep(5000);
		pid_t pid = fork();
		if (pid < 0)
			die("fork");
		if (pid == 0) {
			char *mine = malloc(1000 + (size_t)k * 1000);
			char *big = malloc(3 * MiB);
			if (!mine || !big || !check(shared, 8 * MiB, 5))
				die("the child's heap");
			memset(big, k, 3 * MiB);
			free(big);
			free(mine);
			_exit(0);
		}
		int st;
		if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "child %d of fork %d: %s %d\n", (int)pid, k, WIFSIGNALED(st) ? "signal" : "status",
				WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
			die("a child failed");
		}
	}
	stop = 1;
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (!check(shared, 8 * MiB, 5))
		die("the parent's heap");
	say("ok\n");
	return 0;
}
