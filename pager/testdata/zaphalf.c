/* Frees half of a paged heap in a scatter that empties no slab: every other
 * 128 KiB chunk is dropped (MADV_DONTNEED). Protocol with the test: "ready"
 * once 16 MiB are written, go; "zapped" once half is dropped, go; "ok" once
 * the kept chunks read back their contents and the dropped ones zeros. */
#include "common.h"
#include <sys/mman.h>

#define SIZE (16 * MiB)
#define CHUNK (128 * 1024)

int main(void)
{
	char *p = ready_heap(SIZE, 1);
	for (size_t off = 0; off < SIZE; off += 2 * CHUNK)
		if (madvise(p + off, CHUNK, MADV_DONTNEED) != 0)
			die("madvise");
	say("zapped\n");
	wait_go();
	for (size_t off = 0; off < SIZE; off += 2 * CHUNK) {
		for (size_t i = 0; i < CHUNK; i++)
			if (p[off + i] != 0)
				die("a dropped chunk is not zero");
		/* fill()'s pattern is by word index from the start of the heap */
		const uint64_t *w = (const uint64_t *)(p + off + CHUNK);
		for (size_t i = 0; i < CHUNK / 8; i++)
			if (w[i] != 1 * 0x9e3779b97f4a7c15ull + (off + CHUNK) / 8 + i)
				die("a kept chunk changed");
	}
	say("ok\n");
	return 0;
}
