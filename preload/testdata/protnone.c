/* A PROT_NONE reservation committed and decommitted piecewise, as
 * mimalloc, the JVM and other runtimes do: the reservation is a region
 * (its registration survives mprotect), a MAP_FIXED PROT_NONE decommit
 * keeps the memory in the region and reads as zeros once committed again,
 * and a resident piece made inaccessible by mprotect is evicted without
 * crashing the program. Protocol with the test: "ready" (evict), go;
 * "ready2" (evict), go; "ok". */
#include "common.h"
#include <errno.h>
#include <sys/mman.h>

#define RES (64 * MiB)

/* The words [off, off+n) of a region filled whole with seed's pattern. */
static int check_at(const char *base, size_t off, size_t n, uint64_t seed)
{
	const uint64_t *w = (const uint64_t *)(base + off);
	for (size_t i = 0; i < n / 8; i++)
		if (w[i] != seed * 0x9e3779b97f4a7c15ull + off / 8 + i) {
			fprintf(stderr, "word %zu at offset %zu is %#lx\n", i, off, (unsigned long)w[i]);
			return 0;
		}
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
	char *r = mmap(NULL, RES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r == MAP_FAILED)
		die("mmap reservation");
	if (mprotect(r, 16 * MiB, PROT_READ | PROT_WRITE))
		die("mprotect commit");
	fill(r, 16 * MiB, 1);
	say("ready\n");
	wait_go();
	/* Decommit [4, 8) MiB (mimalloc's way) while it is in the pool,
	 * commit it again: zeros, never the evicted contents. */
	if (mmap(r + 4 * MiB, 4 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) !=
	    r + 4 * MiB)
		die("mmap MAP_FIXED decommit");
	if (mprotect(r + 4 * MiB, 4 * MiB, PROT_READ | PROT_WRITE))
		die("mprotect recommit");
	if (!zeros(r + 4 * MiB, 4 * MiB))
		die("decommitted memory is not zero");
	if (!check_at(r, 0, 4 * MiB, 1) || !check_at(r, 8 * MiB, 8 * MiB, 1))
		die("committed memory after eviction");
	fill(r + 4 * MiB, 4 * MiB, 2);
	/* Commit more; make a resident piece inaccessible. */
	if (mprotect(r + 16 * MiB, 8 * MiB, PROT_READ | PROT_WRITE))
		die("mprotect commit more");
	fill(r + 16 * MiB, 8 * MiB, 3);
	if (mprotect(r + 8 * MiB, 1 * MiB, PROT_NONE))
		die("mprotect PROT_NONE");
	say("ready2\n");
	wait_go();
	if (mprotect(r + 8 * MiB, 1 * MiB, PROT_READ | PROT_WRITE))
		die("mprotect back");
	if (!check_at(r, 0, 4 * MiB, 1) || !check(r + 4 * MiB, 4 * MiB, 2) || !check_at(r, 8 * MiB, 8 * MiB, 1) ||
	    !check(r + 16 * MiB, 8 * MiB, 3))
		die("memory after the second eviction");
	/* The shim copies regions to move them; it cannot copy pages it may
	 * not read: it refuses, as the kernel may. */
	errno = 0;
	if (mremap(r, RES, 2 * RES, MREMAP_MAYMOVE) != MAP_FAILED || errno != ENOMEM)
		die("mremap of a region with PROT_NONE pages");
	if (munmap(r, RES))
		die("munmap");
	say("ok\n");
	return 0;
}
