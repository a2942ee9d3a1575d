/* bench SIZE ITERS TOUCH: time ITERS rounds of malloc(SIZE), optionally
 * writing one byte per page, and free; prints the mean in ns. */
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
	if (argc != 4)
		die("usage: bench SIZE ITERS TOUCH");
	size_t size = strtoull(argv[1], NULL, 0);
	long iters = strtol(argv[2], NULL, 0);
	int touch = atoi(argv[3]);
	/* Warm up: connects to the agent, grows glibc's arenas. */
	free(malloc(size));
	uint64_t t0 = now();
	for (long i = 0; i < iters; i++) {
		volatile char *p = malloc(size);
		if (!p)
			die("malloc");
		if (touch)
			for (size_t off = 0; off < size; off += 4096)
				p[off] = 1;
		free((void *)p);
	}
	printf("ns %.0f\n", (double)(now() - t0) / (double)iters);
	return 0;
}
