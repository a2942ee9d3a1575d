// pattern MIB [WAITFILE]: allocates MIB mebibytes with malloc, writes a
// deterministic pattern into every 8-byte word, then reads it back page by
// page in a permuted page order, checking every word, and prints the
// checksum. With WAITFILE it says "written" after writing and waits until
// WAITFILE exists before reading back (so a test can act mid-run).
// Exit status: 0 all words right, 1 a word is wrong, 2 bad use.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PAGE_WORDS 512

static uint64_t pat(uint64_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: pattern MIB [WAITFILE]\n");
		return 2;
	}
	size_t pages = ((size_t)atol(argv[1]) << 20) / 4096;
	uint64_t *p = malloc(pages * 4096);
	if (!p) {
		perror("malloc");
		return 2;
	}
	for (size_t i = 0; i < pages * PAGE_WORDS; i++)
		p[i] = pat(i);
	printf("written %zu pages\n", pages);
	fflush(stdout);
	if (argc > 2)
		while (access(argv[2], F_OK) != 0)
			usleep(10000);
	// Page k is visited at step (k * stride) mod pages: stride is odd and
	// pages a power of two, so every page is visited once, far apart.
	size_t stride = pages / 2 + pages / 8 + 1;
	uint64_t sum = 0;
	for (size_t k = 0; k < pages; k++) {
		size_t pg = (k * stride) % pages;
		uint64_t *w = p + pg * PAGE_WORDS;
		for (size_t j = 0; j < PAGE_WORDS; j++) {
			uint64_t i = pg * PAGE_WORDS + j;
			if (w[j] != pat(i)) {
				fprintf(stderr, "word %zu: %016llx, want %016llx\n", (size_t)i,
					(unsigned long long)w[j], (unsigned long long)pat(i));
				return 1;
			}
			sum += w[j] * (i | 1);
		}
	}
	printf("checksum %016llx\n", (unsigned long long)sum);
	free(p);
	return 0;
}
