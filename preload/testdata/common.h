/* Helpers for the shim's test programs. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static inline void die(const char *what)
{
	fprintf(stderr, "FAIL: %s\n", what);
	fflush(stderr);
	exit(1);
}

static inline void fill(void *p, size_t n, uint64_t seed)
{
	uint64_t *w = p;
	for (size_t i = 0; i < n / 8; i++)
		w[i] = seed * 0x9e3779b97f4a7c15ull + i;
}

static inline int check(const void *p, size_t n, uint64_t seed)
{
	const uint64_t *w = p;
	for (size_t i = 0; i < n / 8; i++)
		if (w[i] != seed * 0x9e3779b97f4a7c15ull + i) {
			fprintf(stderr, "word %zu of %p is %#lx, want %#lx\n", i, p, (unsigned long)w[i],
				(unsigned long)(seed * 0x9e3779b97f4a7c15ull + i));
			return 0;
		}
	return 1;
}

static inline void say(const char *line)
{
	ssize_t n = write(1, line, strlen(line));
	(void)n;
}

/* Waits for one byte from the test on stdin. */
static inline void wait_go(void)
{
	char c;
	if (read(0, &c, 1) != 1)
		die("stdin closed");
}

/* The prologue of the fork programs: a heap of size bytes filled with
 * seed's pattern, "ready" said, then the test's go awaited (it lets the
 * agent evict meanwhile). */
static inline char *ready_heap(size_t size, uint64_t seed)
{
	char *p = malloc(size);
	if (!p)
		die("malloc");
	fill(p, size, seed);
	say("ready\n");
	wait_go();
	return p;
}
