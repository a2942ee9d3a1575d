// hotcold COLD_MIB HOT_MIB STOPFILE: allocates a cold array and a hot one
// with malloc, writes a pattern into every word of both, says "written",
// then reads random words of the hot array (checking each) until STOPFILE
// exists; then checks every word of both and prints "ok". The cold array
// is written once and read again only at the end: a slowdown target should
// send it to the pool and keep the hot one resident.
// Exit status: 0 all words right, 1 a word is wrong, 2 bad use.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static uint64_t pat(uint64_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: hotcold COLD_MIB HOT_MIB STOPFILE\n");
		return 2;
	}
	size_t cn = ((size_t)atol(argv[1]) << 20) / 8, hn = ((size_t)atol(argv[2]) << 20) / 8;
	uint64_t *c = malloc(cn * 8), *h = malloc(hn * 8);
	if (!c || !h || hn == 0) {
		perror("malloc");
		return 2;
	}
	for (size_t i = 0; i < cn; i++)
		c[i] = pat(i);
	for (size_t i = 0; i < hn; i++)
		h[i] = pat(i + cn);
	printf("written\n");
	fflush(stdout);
	uint64_t x = 88172645463325252ull;
	for (;;) {
		for (int k = 0; k < 1 << 16; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			size_t i = x % hn;
			if (h[i] != pat(i + cn)) {
				printf("BAD hot word %zu\n", i);
				return 1;
			}
		}
		if (access(argv[3], F_OK) == 0)
			break;
	}
	for (size_t i = 0; i < cn; i++)
		if (c[i] != pat(i)) {
			printf("BAD cold word %zu\n", i);
			return 1;
		}
	for (size_t i = 0; i < hn; i++)
		if (h[i] != pat(i + cn)) {
			printf("BAD hot word %zu\n", i);
			return 1;
		}
	printf("ok\n");
	return 0;
}
