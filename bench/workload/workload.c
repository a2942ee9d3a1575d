// The workloads of make bench, one per mode, over a heap of MiB megabytes:
//   seq     write the heap, then read it 4 times in order (both timed)
//   rand    write the heap, then 262,144 8-byte reads at uniformly random places
//   zipf    write the heap, then 262,144 reads of pages drawn Zipfian (theta 0.99)
//   qsort   fill the heap with random 32-bit keys and sort them (qsort(3))
//   kmeans  points of 4 floats over the heap, 4 Lloyd iterations with k = 16
//   touch   the first write to each page of the heap, nothing written before:
//           what a page fault costs here when nothing is paged (the kernel
//           zero-fills the page)
// It prints the measured phase's seconds, a checksum of what it read (the
// same in every configuration, or the run is wrong) and its own CPU seconds.
// rand, zipf and touch also time each access, as the program sees it (from
// the access to its return, fault included, by CLOCK_MONOTONIC read once per
// access): they add the number of accesses that took over 2 us (a cached
// read takes well under 1 us; those are its page faults) and their p50 and
// p99 in us, to 1%.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static int cmp(const void *a, const void *b) {
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

// The accesses that took over slowUs, in a histogram of buckets 1% wide
// (9 KiB: kept small, it counts against zram's memory limit and not
// against rmem's budget).
static const double slowUs = 2;
enum { nbuckets = 1200 }; // slowUs * 1.01^1200: over 300 ms; the last bucket takes the rest
static uint64_t hist[nbuckets], nslow;

static void took(double t0, double t1) {
	double us = (t1 - t0) * 1e6;
	if (us <= slowUs) return;
	int b = (int)(log(us / slowUs) / log(1.01));
	hist[b < nbuckets ? b : nbuckets - 1]++;
	nslow++;
}

// quantile returns the midpoint of the bucket holding quantile q of the
// slow accesses, in us.
static double quantile(double q) {
	uint64_t rank = (uint64_t)(q * (nslow - 1)), seen = 0;
	for (int b = 0; b < nbuckets; b++) {
		seen += hist[b];
		if (seen > rank) return slowUs * pow(1.01, b + 0.5);
	}
	return 0;
}

static double cpu(void) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: workload seq|rand|zipf|qsort|kmeans MiB\n");
		return 2;
	}
	const char *m = argv[1];
	size_t bytes = (size_t)atol(argv[2]) << 20, n = bytes / 8;
	uint64_t *a = malloc(bytes), sum = 0;
	if (!a) return 2;
	double t0, t1;
	int timed = 0;
	if (!strcmp(m, "touch")) {
		timed = 1;
		t0 = now();
		double t = t0;
		for (size_t i = 0; i < n; i += 512) {
			a[i] = i;
			double u = now();
			took(t, u);
			t = u;
		}
		t1 = now();
		for (size_t i = 0; i < n; i += 512) sum += a[i];
	} else if (!strcmp(m, "qsort")) {
		uint32_t *b = (uint32_t *)a;
		size_t k = bytes / 4;
		for (size_t i = 0; i < k; i++) b[i] = (uint32_t)next();
		t0 = now();
		qsort(b, k, 4, cmp);
		t1 = now();
		for (size_t i = 1; i < k; i++) {
			if (b[i - 1] > b[i]) { puts("BAD order"); return 1; }
			sum = sum * 31 + b[i];
		}
	} else if (!strcmp(m, "kmeans")) {
		enum { K = 16, D = 4, ITER = 4 };
		float *p = (float *)a;
		size_t np = bytes / (D * sizeof(float));
		for (size_t i = 0; i < np * D; i++) p[i] = (float)(next() % 100000) / 1000.0f;
		float c[K][D];
		for (int j = 0; j < K; j++)
			for (int d = 0; d < D; d++) c[j][d] = p[j * D + d];
		t0 = now();
		for (int it = 0; it < ITER; it++) {
			double s[K][D] = {{0}};
			size_t cnt[K] = {0};
			for (size_t i = 0; i < np; i++) {
				int best = 0;
				float bd = INFINITY;
				for (int j = 0; j < K; j++) {
					float dd = 0;
					for (int d = 0; d < D; d++) {
						float x = p[i * D + d] - c[j][d];
						dd += x * x;
					}
					if (dd < bd) { bd = dd; best = j; }
				}
				cnt[best]++;
				for (int d = 0; d < D; d++) s[best][d] += p[i * D + d];
			}
			for (int j = 0; j < K; j++)
				for (int d = 0; d < D; d++)
					if (cnt[j]) c[j][d] = (float)(s[j][d] / cnt[j]);
		}
		t1 = now();
		for (int j = 0; j < K; j++)
			for (int d = 0; d < D; d++) sum = sum * 31 + (uint64_t)(c[j][d] * 1000);
	} else {
		t0 = now(); // seq counts its writes too; the others start after them
		for (size_t i = 0; i < n; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
		if (strcmp(m, "seq")) t0 = now();
		if (!strcmp(m, "seq")) {
			for (int p = 0; p < 4; p++)
				for (size_t i = 0; i < n; i++) sum += a[i];
		} else if (!strcmp(m, "rand") || !strcmp(m, "zipf")) {
			size_t pages = bytes / 4096;
			double *cdf = NULL;
			if (m[0] == 'z') { // Zipfian over pages, theta 0.99, page ranks shuffled
				cdf = malloc(pages * sizeof(double));
				double h = 0;
				for (size_t r = 0; r < pages; r++) h += 1.0 / pow(r + 1, 0.99);
				double acc = 0;
				for (size_t r = 0; r < pages; r++) cdf[r] = (acc += 1.0 / pow(r + 1, 0.99) / h);
			}
			timed = 1;
			double t = now();
			for (size_t k = 0; k < 262144; k++) {
				size_t i;
				if (cdf) {
					double u = (double)(next() >> 11) / 9007199254740992.0;
					size_t lo = 0, hi = pages - 1;
					while (lo < hi) {
						size_t mid = (lo + hi) / 2;
						if (cdf[mid] < u) lo = mid + 1; else hi = mid;
					}
					size_t page = (lo * 2654435761u) % pages; // hot pages spread over the heap
					i = page * 512 + next() % 512;
				} else {
					i = next() % n;
				}
				if (a[i] != i * 0x9E3779B97F4A7C15ull) { printf("BAD word %zu\n", i); return 1; }
				sum += a[i];
				double u = now(); // one clock read per access: t is the previous one's end
				took(t, u);
				t = u;
			}
			free(cdf);
		} else {
			fprintf(stderr, "unknown workload %s\n", m);
			return 2;
		}
		t1 = now();
	}
	if (timed) {
		printf("%.3f %016llx %.3f %llu %.2f %.2f\n", t1 - t0, (unsigned long long)sum, cpu(), (unsigned long long)nslow,
		       nslow ? quantile(0.5) : 0, nslow ? quantile(0.99) : 0);
	} else {
		printf("%.3f %016llx %.3f\n", t1 - t0, (unsigned long long)sum, cpu());
	}
	return 0;
}
