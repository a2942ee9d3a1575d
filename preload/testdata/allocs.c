/* The malloc family under the allocator the program is linked with:
 * glibc's (the shim is the allocator: its heap), or jemalloc, tcmalloc or
 * mimalloc (the shim forwards to it). API corners first, each checked;
 * then 192 blocks of 1 MiB and 2,000,000 of 56 bytes, filled with
 * patterns; "addrs" (a small block, a big one, the pointer array), "ready"
 * (the test evicts), go; everything checked exactly; "ok". Built with
 * -DJEMALLOC it also calls jemalloc's own API on memory from malloc and
 * strdup (redis-server's pattern: malloc_usable_size, sdallocx). Linked
 * with jemalloc it needs the shim: jemalloc has no pvalloc nor
 * reallocarray, so glibc's would make those blocks and jemalloc's free
 * would crash on them (it does without the shim); the shim builds them on
 * jemalloc's own functions. */
#include "common.h"
#include <errno.h>
#include <malloc.h>
#ifdef JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#define NBIG 192
#define NSMALL 2000000
#define SMALL 56

static uint64_t word(size_t i, size_t j) { return (i * 7 + j) * 0x9e3779b97f4a7c15ull ^ 0x5a5a; }

static void fill_bytes(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 131 + seed);
}

static int check_bytes(const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 131 + seed))
			return 0;
	return 1;
}

/* volatile: sizes the compiler cannot see overflow */
static volatile size_t huge = (size_t)1 << 40, huger = (size_t)1 << 62;

static void api(void)
{
	char *p = malloc(100);
	if (!p || malloc_usable_size(p) < 100)
		die("malloc_usable_size");
	memset(p, 1, 100);
	free(p);

	/* realloc growth across 64 KiB and up, contents kept each step */
	size_t sizes[] = {1000, 60 << 10, 70 << 10, 1 * MiB, 8 * MiB, 3000, 200 << 10};
	unsigned char *r = NULL;
	size_t have = 0;
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i];
		r = realloc(r, n);
		if (!r || malloc_usable_size(r) < n)
			die("realloc");
		if (!check_bytes(r, have < n ? have : n, 7))
			die("realloc lost contents");
		fill_bytes(r, n, 7);
		have = n;
	}
	free(r);

	/* calloc zeroes memory that was used and freed */
	size_t zs[] = {SMALL, 4096, 100000, 3 * MiB};
	for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++) {
		for (int k = 0; k < 4; k++) {
			unsigned char *a = malloc(zs[i]);
			if (!a)
				die("malloc");
			memset(a, 0xff, zs[i]);
			free(a);
			unsigned char *c = calloc(1, zs[i]);
			if (!c)
				die("calloc");
			for (size_t j = 0; j < zs[i]; j++)
				if (c[j])
					die("calloc memory not zero after reuse");
			free(c);
		}
	}
	if (calloc(huge, huge) != NULL)
		die("calloc overflow");

	/* aligned allocations */
	size_t aligns[] = {16, 64, 4096, 65536, 2 * MiB, 64 * MiB};
	for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
		void *q;
		size_t n = 1000 + aligns[i];
		if (posix_memalign(&q, aligns[i], n) != 0 || (uintptr_t)q % aligns[i] || malloc_usable_size(q) < n)
			die("posix_memalign");
		memset(q, 3, n);
		free(q);
	}
	void *q;
	if (posix_memalign(&q, 24, 100) != EINVAL)
		die("posix_memalign accepted alignment 24");
	char *aa = aligned_alloc(4096, 8192), *ma = memalign(128, 300), *va = valloc(5000), *pv = pvalloc(5000);
	if (!aa || !ma || !va || !pv || (uintptr_t)aa % 4096 || (uintptr_t)ma % 128 || (uintptr_t)va % 4096 ||
	    (uintptr_t)pv % 4096 || malloc_usable_size(pv) < 8192)
		die("aligned_alloc, memalign, valloc or pvalloc");
	memset(aa, 1, 8192);
	memset(ma, 2, 300);
	memset(va, 3, 5000);
	memset(pv, 4, 8192);
	free(aa);
	free(ma);
	free(va);
	free(pv);
	uint64_t *ra = reallocarray(NULL, 1000, 8);
	if (!ra)
		die("reallocarray");
	ra[999] = 1;
	errno = 0;
	if (reallocarray(ra, huger, 8) != NULL || errno != ENOMEM)
		die("reallocarray overflow");
	free(ra);

	/* libc's own allocations, freed by the program */
	char *s = strdup("a string from libc");
	char *f = NULL;
	if (!s || asprintf(&f, "%s %d", s, 42) < 0 || strcmp(f, "a string from libc 42"))
		die("strdup or asprintf");
	free(f);
#ifdef JEMALLOC
	/* jemalloc's API on the memory malloc and libc gave us */
	if (malloc_usable_size(s) < strlen(s) + 1 || sallocx(s, 0) < strlen(s) + 1)
		die("malloc_usable_size or sallocx of strdup's memory");
	sdallocx(s, strlen("a string from libc") + 1, 0);
	void *x = malloc(1000);
	if (!x || malloc_usable_size(x) < 1000)
		die("jemalloc malloc_usable_size");
	x = rallocx(x, 5000, 0);
	if (!x)
		die("rallocx");
	sdallocx(x, 5000, 0);
	unsigned char *y = mallocx(4096, MALLOCX_ALIGN(4096) | MALLOCX_ZERO);
	if (!y || (uintptr_t)y % 4096)
		die("mallocx");
	for (int i = 0; i < 4096; i++)
		if (y[i])
			die("mallocx MALLOCX_ZERO");
	dallocx(y, 0);
#else
	free(s);
#endif
}

int main(void)
{
	api();
	unsigned char **big = malloc(NBIG * sizeof *big);
	uint64_t **small = malloc(NSMALL * sizeof *small);
	if (!big || !small)
		die("malloc");
	for (int i = 0; i < NBIG; i++) {
		if (!(big[i] = malloc(MiB)))
			die("malloc 1 MiB");
		fill(big[i], MiB, 1000 + i);
	}
	for (size_t i = 0; i < NSMALL; i++) {
		if (!(small[i] = malloc(SMALL)))
			die("malloc 56");
		for (size_t j = 0; j < SMALL / 8; j++)
			small[i][j] = word(i, j);
	}
	printf("addrs %p %p %p %p\n", (void *)small[0], (void *)small[NSMALL - 1], (void *)big[NBIG - 1], (void *)small);
	fflush(stdout);
	say("ready\n");
	wait_go();
	for (int i = 0; i < NBIG; i++)
		if (!check(big[i], MiB, 1000 + i))
			die("a 1 MiB block changed");
	for (size_t i = 0; i < NSMALL; i++)
		for (size_t j = 0; j < SMALL / 8; j++)
			if (small[i][j] != word(i, j)) {
				fprintf(stderr, "block %zu word %zu: %#lx\n", i, j, (unsigned long)small[i][j]);
				die("a 56-byte block changed");
			}
	/* Half of them freed, the others moved by realloc and checked. */
	for (size_t i = 0; i < NSMALL; i += 2)
		free(small[i]);
	for (size_t i = 1; i < NSMALL; i += 64) {
		small[i] = realloc(small[i], 200);
		if (!small[i] || small[i][SMALL / 8 - 1] != word(i, SMALL / 8 - 1))
			die("realloc of a small block");
	}
	for (size_t i = 1; i < NSMALL; i += 2)
		free(small[i]);
	for (int i = 0; i < NBIG; i++)
		free(big[i]);
	free(small);
	free(big);
	say("ok\n");
	return 0;
}
