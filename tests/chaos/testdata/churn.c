// churn MIB ROUNDS [GATE]: pages a heap of MIB mebibytes through ROUNDS
// rounds. Each round rewrites every 8-byte word with a pattern of (word,
// round), then reads the heap back page by page in a permuted order,
// checks every word and prints "round R SUM". From round ROUNDS/2 on a
// second buffer of MIB/2 is allocated and churned too (so the agent needs
// new pool slabs mid-run). With GATE it waits after round 0 until the file
// GATE exists (a test injects its fault then). Exit status: 0 all words
// right, 1 a word is wrong, 2 bad use.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PAGE_WORDS 512

static uint64_t pat(uint64_t i, uint64_t r) {
	return (i * 0x9E3779B97F4A7C15ull + 1) ^ (r * 0xD1B54A32D192ED03ull);
}

// churn rewrites pages [0, pages) of p (global word index base) for round
// r and returns the checksum of a permuted read-back, or exits 1.
static uint64_t churn(uint64_t *p, size_t pages, uint64_t base, uint64_t r) {
	for (size_t i = 0; i < pages * PAGE_WORDS; i++)
		p[i] = pat(base + i, r);
	size_t stride = pages / 2 + pages / 8 + 1; // odd; pages is a power of two
	uint64_t sum = 0;
	for (size_t k = 0; k < pages; k++) {
		size_t pg = (k * stride) % pages;
		uint64_t *w = p + pg * PAGE_WORDS;
		for (size_t j = 0; j < PAGE_WORDS; j++) {
			uint64_t i = base + pg * PAGE_WORDS + j;
			if (w[j] != pat(i, r)) {
				fprintf(stderr, "round %llu word %llu: %016llx, want %016llx\n", (unsigned long long)r,
					(unsigned long long)i, (unsigned long long)w[j], (unsigned long long)pat(i, r));
				exit(1);
			}
			sum += w[j] * (i | 1);
		}
	}
	return sum;
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: churn MIB ROUNDS [GATE]\n");
		return 2;
	}
	size_t pages = ((size_t)atol(argv[1]) << 20) / 4096;
	int rounds = atoi(argv[2]);
	if (pages < 2 || (pages & (pages - 1)) != 0 || rounds < 1) {
		fprintf(stderr, "churn: MIB must be a power of two, ROUNDS positive\n");
		return 2;
	}
	uint64_t *p = malloc(pages * 4096), *q = NULL;
	if (!p) {
		perror("malloc");
		return 2;
	}
	for (int r = 0; r < rounds; r++) {
		if (r == rounds / 2 && r > 0 && !(q = malloc(pages / 2 * 4096))) {
			perror("malloc");
			return 2;
		}
		uint64_t sum = churn(p, pages, 0, r);
		if (q)
			sum += churn(q, pages / 2, pages * PAGE_WORDS, r);
		printf("round %d %016llx\n", r, (unsigned long long)sum);
		fflush(stdout);
		if (r == 0 && argc > 3)
			while (access(argv[3], F_OK) != 0)
				usleep(10000);
	}
	free(q);
	free(p);
	return 0;
}
