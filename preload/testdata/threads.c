/* Threads allocate, fill, check and free big and small blocks until the
 * test sends the go byte; the test evicts meanwhile. Each thread also
 * keeps 4096 small blocks of its own, replacing a few and checking all of
 * them every round (in glibc mode they are the heap's, paged too). */
#include "common.h"
#include <pthread.h>

#define THREADS 6

static volatile int stop;
static long rounds[THREADS];

#define KEEP 4096

static void *worker(void *arg)
{
	long id = (long)arg;
	uint64_t seed = (uint64_t)id << 32;
	static __thread uint64_t *keep[KEEP];
	static __thread size_t keep_len[KEEP];
	static __thread uint64_t keep_seed[KEEP];
	for (int i = 0; i < KEEP; i++) {
		keep_len[i] = 16 + (size_t)(i * 40) % 500;
		keep_seed[i] = seed + (uint64_t)i;
		if (!(keep[i] = malloc(keep_len[i])))
			die("malloc");
		fill(keep[i], keep_len[i], keep_seed[i]);
	}
	while (!stop) {
		for (uint64_t k = 0; k < 64; k++) {
			int i = (int)((seed * 2654435761u + k * 40503u) % KEEP);
			free(keep[i]);
			keep_len[i] = 16 + (seed + k) % 700;
			keep_seed[i] = seed * 1000 + k;
			if (!(keep[i] = malloc(keep_len[i])))
				die("malloc");
			fill(keep[i], keep_len[i], keep_seed[i]);
		}
		for (int i = 0; i < KEEP; i++)
			if (!check(keep[i], keep_len[i], keep_seed[i]))
				die("a small block changed under a thread");
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
