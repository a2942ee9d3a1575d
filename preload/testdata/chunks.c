/* An allocator that maps its own chunks, as jemalloc and tcmalloc do:
 * over-map, trim to 4 MiB alignment with munmap, hand out pieces, give
 * pages back with MADV_DONTNEED, before and after they were evicted. */
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
	/* The agent evicted the pages: give back the last quarter of chunk 2,
	 * which is in the pool now. It must read as zeros too, not as the
	 * evicted contents. */
	if (madvise(c[2] + 3 * CHUNK / 4, CHUNK / 4, MADV_DONTNEED))
		die("madvise of evicted pages");
	for (int i = 0; i < 4; i++) {
		size_t n = i == 1 ? CHUNK / 2 : i == 2 ? 3 * CHUNK / 4 : CHUNK;
		if (!check(c[i], n, 20 + i))
			die("chunk contents after eviction");
	}
	for (size_t i = CHUNK / 2; i < CHUNK; i++)
		if (c[1][i])
			die("MADV_DONTNEED pages are not zero");
	for (size_t i = 3 * CHUNK / 4; i < CHUNK; i++)
		if (c[2][i])
			die("MADV_DONTNEED of evicted pages: not zero");
	for (int i = 0; i < 4; i++)
		munmap(c[i], CHUNK);
	say("ok\n");
	return 0;
}
