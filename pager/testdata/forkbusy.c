/* Forks while other threads fault: 16 MiB filled (most of it evicted
 * under a 4 MiB budget), 3 threads read and check random pages without
 * pause (faults, prefetches and evictions go on across every fork), and
 * the main thread forks 4 times. Each child checks every word its parent
 * had, writes and checks its own values, and exits 0. The parent waits for
 * each child, stops the threads and checks everything again; it prints
 * "ok". */
#include "common.h"
#include <pthread.h>
#include <sys/wait.h>

#define SIZE (16 * MiB)
#define PAGE 4096

static uint64_t *mem;
static volatile int stop;

static void *reader(void *arg)
{
	uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
	while (!stop) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t w = (x % (SIZE / PAGE)) * (PAGE / 8) + (x >> 40) % (PAGE / 8);
		if (mem[w] != 1 * 0x9e3779b97f4a7c15ull + w) {
			fprintf(stderr, "reader: word %zu is %#lx\n", w, (unsigned long)mem[w]);
			die("a reader saw a wrong word");
		}
	}
	return NULL;
}

int main(void)
{
	mem = malloc(SIZE);
	if (!mem)
		die("malloc");
	fill(mem, SIZE, 1);
	pthread_t t[3];
	for (uintptr_t i = 0; i < 3; i++)
		if (pthread_create(&t[i], NULL, reader, (void *)(i + 1)) != 0)
			die("pthread_create");
	for (int k = 0; k < 4; k++) {
		usleep(50 * 1000);
		pid_t pid = fork();
		if (pid < 0)
			die("fork");
		if (pid == 0) {
			if (!check(mem, SIZE, 1))
				die("a child sees wrong contents after fork");
			fill(mem, SIZE, 10 + k);
			if (!check(mem, SIZE, 10 + k))
				die("a child lost its own writes");
			_exit(0);
		}
		int st;
		if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			die("a child failed");
	}
	stop = 1;
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (!check(mem, SIZE, 1))
		die("the parent sees its children's writes");
	free(mem);
	say("ok\n");
	return 0;
}
