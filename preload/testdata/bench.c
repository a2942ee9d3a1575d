/* bench SIZE ITERS TOUCH [BATCH]: time ITERS rounds of BATCH (default 1)
 * malloc(SIZE), optionally writing one byte per page of each, then their
 * frees; prints the mean per malloc+free in ns. */
#include "common.h"
#include <time.h>

static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5)
		die("usage: bench SIZE ITERS TOUCH [BATCH]");
	size_t size = strtoull(argv[1], NULL, 0);
	long iters = strtol(argv[2], NULL, 0);
	int touch = atoi(argv[3]);
	long batch = argc == 5 ? strtol(argv[4], NULL, 0) : 1;
	volatile char **p = malloc((size_t)batch * sizeof *p);
	if (!p || batch < 1)
		die("batch");
	/* Warm up: connects to the agent, grows the allocator's arenas. */
	free(malloc(size));
	uint64_t t0 = now();
	for (long i = 0; i < iters; i++) {
		for (long j = 0; j < batch; j++) {
			if (!(p[j] = malloc(size)))
				die("malloc");
			if (touch)
				for (size_t off = 0; off < size; off += 4096)
					p[j][off] = 1;
		}
		for (long j = 0; j < batch; j++)
			free((void *)p[j]);
	}
	printf("ns %.1f\n", (double)(now() - t0) / (double)iters / (double)batch);
	return 0;
}
