/* A statically linked program (TestStaticBinary builds it with gcc
 * -static: no dynamic loader, so no LD_PRELOAD shim): argv[1] MiB of
 * malloc'd words written, read back at random and summed; glibc's brk
 * heap of small blocks too. Prints the sums. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
	size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 0, n = (mib << 20) / 8;
	uint64_t *a = malloc(n * 8 + 8), sum = 0, x = 88172645463325252ull;
	for (size_t i = 0; i < n; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
	for (size_t k = 0; n && k < 100000; k++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		size_t i = x % n;
		if (a[i] != i * 0x9E3779B97F4A7C15ull) { printf("BAD %zu\n", i); return 1; }
		sum += a[i];
	}
	enum { S = 20000 };
	static char *small[S];
	uint64_t s2 = 0;
	for (int i = 0; n && i < S; i++) { small[i] = malloc(1000); memset(small[i], i, 1000); }
	for (int i = 0; n && i < S; i++) s2 += (unsigned char)small[i][i % 1000];
	printf("%zu MiB: %llu %llu\n", mib, (unsigned long long)sum, (unsigned long long)s2);
	return 0;
}
