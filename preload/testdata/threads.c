/* Threads allocate, fill, check and free big and small blocks until the
 * test sends the go byte; the test evicts meanwhile. */
#include "common.h"
#include <pthread.h>

#define THREADS 6

static volatile int stop;
static long rounds[THREADS];

static void *worker(void *arg)
{
	long id = (long)arg;
	uint64_t seed = (uint64_t)id << 32;
	while (!stop) {
		size_t big = (size_t)(1 + (seed % 3)) * MiB + (seed % 7) * 4096;
		char *b = (seed & 1) ? malloc(big) : calloc(1, big);
		char *s = malloc(64 + seed % 512);
		if (!b || !s)
			die("malloc");
		fill(b, big, seed);
		fill(s, 64, seed + 1);
		for (int i = 0; i < 20 && !stop; i++)
			if (!check(b, big, seed) || !check(s, 64, seed + 1))
				die("contents changed under a thread");
		b = realloc(b, big + MiB);
		if (!b || !check(b, big, seed))
			die("realloc contents");
		free(b);
		free(s);
		seed++;
		rounds[id]++;
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	for (long i = 0; i < THREADS; i++)
		if (pthread_create(&t[i], NULL, worker, (void *)i))
			die("pthread_create");
	say("ready\n");
	wait_go();
	stop = 1;
	long total = 0;
	for (int i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		total += rounds[i];
	}
	printf("ok %ld rounds\n", total);
	return 0;
}
