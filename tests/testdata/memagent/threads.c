// threads MIB N: N threads (at most 64) fault on shared and separate pages.
// Half of MIB mebibytes is one malloc'd region shared by all threads, the
// other half is split into one malloc'd region per thread. Each thread
// writes its own region and its own pages of the shared one (page p is
// thread p%N's); after a barrier every thread reads back all shared pages
// and its own region, page by page in a permuted order from a different
// start, and checks every word. Prints the sum of the threads' checksums.
// Exit status: 0 all words right, 1 a word is wrong, 2 bad use.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PAGE_WORDS 512

static uint64_t pat(uint64_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }

static size_t nthreads, shared_pages, own_pages;
static uint64_t *shared;
static pthread_barrier_t barrier;

struct worker {
	size_t id;
	uint64_t sum;
	int bad;
};

// verify checks pages [0, n) of p in the order start, start+stride, ...
// against pat(i + base) and adds the words to *sum.
static int verify(const uint64_t *p, size_t n, size_t start, uint64_t base, uint64_t *sum) {
	size_t stride = n / 2 + n / 8 + 1; // odd: a permutation of a power of two
	for (size_t k = 0; k < n; k++) {
		size_t pg = (start + k * stride) % n;
		for (size_t j = 0; j < PAGE_WORDS; j++) {
			uint64_t i = pg * PAGE_WORDS + j;
			if (p[i] != pat(i + base)) {
				fprintf(stderr, "base %llx word %zu: %016llx, want %016llx\n", (unsigned long long)base,
					(size_t)i, (unsigned long long)p[i], (unsigned long long)pat(i + base));
				return 1;
			}
			*sum += p[i] * (i | 1);
		}
	}
	return 0;
}

static void *run(void *arg) {
	struct worker *w = arg;
	uint64_t base = (uint64_t)(w->id + 1) << 40;
	uint64_t *own = malloc(own_pages * 4096);
	if (!own) {
		perror("malloc");
		w->bad = 2;
	} else {
		for (size_t i = 0; i < own_pages * PAGE_WORDS; i++)
			own[i] = pat(i + base);
	}
	for (size_t pg = w->id; pg < shared_pages; pg += nthreads)
		for (size_t j = 0; j < PAGE_WORDS; j++)
			shared[pg * PAGE_WORDS + j] = pat(pg * PAGE_WORDS + j);
	pthread_barrier_wait(&barrier);
	if (w->bad)
		return NULL;
	w->bad = verify(shared, shared_pages, w->id * shared_pages / nthreads, 0, &w->sum) ||
		 verify(own, own_pages, 0, base, &w->sum);
	free(own);
	return NULL;
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: threads MIB N\n");
		return 2;
	}
	size_t mib = (size_t)atol(argv[1]);
	nthreads = (size_t)atol(argv[2]);
	if (nthreads < 1 || nthreads > 64) {
		fprintf(stderr, "threads: N must be 1 to 64\n");
		return 2;
	}
	shared_pages = (mib << 20) / 2 / 4096;
	own_pages = shared_pages / nthreads;
	shared = malloc(shared_pages * 4096);
	if (!shared) {
		perror("malloc");
		return 2;
	}
	pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
	pthread_t tids[64];
	struct worker ws[64] = {0};
	for (size_t t = 0; t < nthreads; t++) {
		ws[t].id = t;
		if (pthread_create(&tids[t], NULL, run, &ws[t])) {
			fprintf(stderr, "pthread_create failed\n");
			return 2;
		}
	}
	uint64_t sum = 0;
	int bad = 0;
	for (size_t t = 0; t < nthreads; t++) {
		pthread_join(tids[t], NULL);
		sum += ws[t].sum;
		if (ws[t].bad > bad)
			bad = ws[t].bad;
	}
	if (bad)
		return bad;
	printf("checksum %016llx\n", (unsigned long long)sum);
	free(shared);
	return 0;
}
