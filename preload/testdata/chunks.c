/* An allocator that maps its own chunks, as jemalloc and tcmalloc do:
 * over-map, trim to 4 MiB alignment with munmap, hand out pieces, give
 * pages back with MADV_DONTNEED and MADV_FREE (which the shim does as
 * MADV_DONTNEED: they read as zeros at once), before and after they were
 * evicted; ask for huge pages (ignored on paged memory). */
#include "common.h"
#include <sys/mman.h>

#define CHUNK (4 * MiB)

static char *chunk_alloc(void)
{
	char *p = mmap(NULL, 2 * CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	uintptr_t a = ((uintptr_t)p + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1);
	if (a > (uintptr_t)p && munmap(p, a - (uintptr_t)p))
		die("trim head");
	if (munmap((char *)a + CHUNK, (uintptr_t)p + 2 * CHUNK - a - CHUNK))
		die("trim tail");
	return (char *)a;
}

/* The words [off, off+n) of a chunk filled whole with seed's pattern. */
static int check_at(const char *base, size_t off, size_t n, uint64_t seed)
{
	const uint64_t *w = (const uint64_t *)(base + off);
	for (size_t i = 0; i < n / 8; i++)
		if (w[i] != seed * 0x9e3779b97f4a7c15ull + off / 8 + i)
			return 0;
	return 1;
}

static int zeros(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

int main(void)
{
	char *c[4];
	for (int i = 0; i < 4; i++) {
		c[i] = chunk_alloc();
		fill(c[i], CHUNK, 20 + i);
	}
	/* Give back the second half of chunk 1: it must read as zeros. */
	if (madvise(c[1] + CHUNK / 2, CHUNK / 2, MADV_DONTNEED))
		die("madvise");
	say("ready\n");
	wait_go();
	/* The agent evicted the pages: give back the last quarter of chunk 2
	 * and the first half of chunk 3, which are in the pool now. They must
	 * read as zeros too, not as the evicted contents. */
	if (madvise(c[2] + 3 * CHUNK / 4, CHUNK / 4, MADV_DONTNEED))
		die("madvise of evicted pages");
	if (madvise(c[3], CHUNK / 2, MADV_FREE))
		die("madvise MADV_FREE of evicted pages");
	/* And the second quarter of chunk 0, resident again. */
	if (!check(c[0], CHUNK, 20) || madvise(c[0] + CHUNK / 4, CHUNK / 4, MADV_FREE))
		die("madvise MADV_FREE");
	if (madvise(c[1], CHUNK, MADV_HUGEPAGE))
		die("madvise MADV_HUGEPAGE");
	if (!check_at(c[0], 0, CHUNK / 4, 20) || !check_at(c[0], CHUNK / 2, CHUNK / 2, 20) ||
	    !check_at(c[1], 0, CHUNK / 2, 21) || !check_at(c[2], 0, 3 * CHUNK / 4, 22) ||
	    !check_at(c[3], CHUNK / 2, CHUNK / 2, 23))
		die("chunk contents after eviction");
	if (!zeros(c[1] + CHUNK / 2, CHUNK / 2))
		die("MADV_DONTNEED pages are not zero");
	if (!zeros(c[2] + 3 * CHUNK / 4, CHUNK / 4))
		die("MADV_DONTNEED of evicted pages: not zero");
	if (!zeros(c[3], CHUNK / 2))
		die("MADV_FREE of evicted pages: not zero");
	if (!zeros(c[0] + CHUNK / 4, CHUNK / 4))
		die("MADV_FREE pages are not zero");
	for (int i = 0; i < 4; i++)
		munmap(c[i], CHUNK);
	say("ok\n");
	return 0;
}
