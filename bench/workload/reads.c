// reads: writes a heap of MiB (argv[1]) MiB, says "written" (a file in
// DIR, argv[2]), waits for DIR/go, then makes 262,144 reads of random
// words, timing each as the program sees it; prints the count, p50 and p99
// of those over 2 us (its page faults), in us, and exits 1 on a wrong word.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
	if (argc != 3) { fprintf(stderr, "usage: reads MiB DIR\n"); return 2; }
	size_t n = (size_t)atoi(argv[1]) << 20 >> 3;
	volatile uint64_t *a = malloc(n * 8);
	if (!a) return 2;
	for (size_t i = 0; i < n; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
	char f[4096];
	snprintf(f, sizeof f, "%s/written", argv[2]); fclose(fopen(f, "w"));
	snprintf(f, sizeof f, "%s/go", argv[2]);
	while (access(f, F_OK)) usleep(10000);
	static double sl[262144];
	long k = 0; uint64_t x = 88172645463325252ull;
	for (int j = 0; j < 262144; j++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		size_t i = x % n;
		double t = now(); uint64_t v = a[i]; double e = now() - t;
		if (e > 2) sl[k++] = e;
		if (v != i * 0x9E3779B97F4A7C15ull) { printf("BAD word %zu\n", i); return 1; }
	}
	qsort(sl, k, sizeof(double), cd);
	printf("%ld %.2f %.2f\n", k, k ? sl[k / 2] : 0.0, k ? sl[k * 99 / 100] : 0.0);
	return 0;
}
