/* Every allocation entry point, big and small; the test evicts everything
 * between "ready" and the go byte, then the contents are checked. */
#include "common.h"
#include <malloc.h>
#include <sys/mman.h>

int main(void)
{
	char *m = malloc(8 * MiB);
	char *c = calloc(2, 4 * MiB);
	void *pa;
	if (!m || !c || posix_memalign(&pa, 64 * 1024, 4 * MiB))
		die("big allocation");
	char *aa = aligned_alloc(2 * MiB, 4 * MiB);
	char *ma = memalign(8192, 2 * MiB);
	char *va = valloc(2 * MiB);
	char *pv = pvalloc(2 * MiB + 1);
	if (!aa || !ma || !va || !pv)
		die("aligned allocation");
	if ((uintptr_t)pa % (64 * 1024) || (uintptr_t)aa % (2 * MiB) || (uintptr_t)ma % 8192 ||
	    (uintptr_t)va % 4096 || (uintptr_t)pv % 4096)
		die("alignment");
	for (size_t i = 0; i < 8 * MiB; i += 4096)
		if (c[i])
			die("calloc memory not zero");
	if (malloc_usable_size(m) < 8 * MiB || malloc_usable_size(pv) < 2 * MiB + 4096)
		die("malloc_usable_size");
	fill(m, 8 * MiB, 1);
	fill(c, 8 * MiB, 2);
	fill(pa, 4 * MiB, 3);
	fill(aa, 4 * MiB, 4);
	fill(ma, 2 * MiB, 5);
	fill(va, 2 * MiB, 6);
	fill(pv, 2 * MiB, 7);

	/* realloc: big grows (moves), small grows into a region, big shrinks
	 * to small, reallocarray. */
	char *r = malloc(2 * MiB);
	fill(r, 2 * MiB, 8);
	r = realloc(r, 6 * MiB);
	if (!r || !check(r, 2 * MiB, 8))
		die("realloc big grow");
	fill(r + 2 * MiB, 4 * MiB, 9);
	char *s = malloc(1000);
	memset(s, 'x', 1000);
	s = realloc(s, 3 * MiB);
	if (!s || s[0] != 'x' || s[999] != 'x')
		die("realloc small to big");
	fill(s, 3 * MiB, 10);
	char *t = malloc(2 * MiB);
	fill(t, 2 * MiB, 11);
	t = realloc(t, 128);
	if (!t || !check(t, 128, 11))
		die("realloc big to small");
	uint64_t *ra = reallocarray(NULL, MiB / 4, 8);
	if (!ra)
		die("reallocarray");
	fill(ra, 2 * MiB, 12);
	char *small[64];
	for (int i = 0; i < 64; i++) {
		small[i] = malloc(100 + i);
		memset(small[i], i, 100 + i);
	}

	/* Anonymous mmap: trim the head like jemalloc does, punch a hole,
	 * grow a piece with mremap. */
	char *mm = mmap(NULL, 12 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mm == MAP_FAILED)
		die("mmap");
	if (munmap(mm, 2 * MiB))
		die("munmap head");
	mm += 2 * MiB; /* 10 MiB */
	fill(mm, 10 * MiB, 13);
	if (munmap(mm + 4 * MiB, 2 * MiB)) /* hole: [0,4) and [6,10) remain */
		die("munmap hole");
	char *grown = mremap(mm + 6 * MiB, 4 * MiB, 8 * MiB, MREMAP_MAYMOVE);
	if (grown == MAP_FAILED)
		die("mremap grow");
	fill(grown + 4 * MiB, 4 * MiB, 14);
	char *shrunk = mremap(mm, 4 * MiB, 2 * MiB, 0);
	if (shrunk != mm)
		die("mremap shrink in place");
	char *fixed = mmap(mm, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (fixed != mm)
		die("mmap MAP_FIXED over a region");
	memset(fixed, 0x5a, 1 * MiB);

	say("ready\n");
	wait_go();

	if (!check(m, 8 * MiB, 1) || !check(c, 8 * MiB, 2) || !check(pa, 4 * MiB, 3) ||
	    !check(aa, 4 * MiB, 4) || !check(ma, 2 * MiB, 5) || !check(va, 2 * MiB, 6) ||
	    !check(pv, 2 * MiB, 7))
		die("contents after eviction");
	if (!check(r, 2 * MiB, 8) || !check(r + 2 * MiB, 4 * MiB, 9) || !check(s, 3 * MiB, 10) ||
	    !check(t, 128, 11) || !check(ra, 2 * MiB, 12))
		die("realloc contents after eviction");
	for (int i = 0; i < 64; i++)
		for (int j = 0; j < 100 + i; j++)
			if (small[i][j] != (char)i)
				die("small allocation");
	for (size_t i = 0; i < 1 * MiB; i++)
		if ((unsigned char)fixed[i] != 0x5a)
			die("MAP_FIXED mapping");
	/* mm + [1,2) MiB keeps seed 13's words 131072.. */
	uint64_t *w = (uint64_t *)(mm + 1 * MiB);
	for (size_t i = 0; i < MiB / 8; i++)
		if (w[i] != 13 * 0x9e3779b97f4a7c15ull + MiB / 8 + i)
			die("mmap region after eviction");
	w = (uint64_t *)grown;
	for (size_t i = 0; i < 4 * MiB / 8; i++)
		if (w[i] != 13 * 0x9e3779b97f4a7c15ull + 6 * MiB / 8 + i)
			die("mremap-moved contents");
	if (!check(grown + 4 * MiB, 4 * MiB, 14))
		die("mremap-grown contents");

	free(m);
	free(c);
	free(pa);
	free(aa);
	free(ma);
	free(va);
	free(pv);
	free(r);
	free(s);
	free(t);
	free(ra);
	for (int i = 0; i < 64; i++)
		free(small[i]);
	munmap(mm, 2 * MiB);
	munmap(grown, 8 * MiB);
	say("ok\n");
	return 0;
}
