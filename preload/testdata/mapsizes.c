/* Which direct mmaps become regions: 60 KiB no, 64 KiB (the default
 * min-alloc) and 1 MiB yes, a 65 GiB reservation no (over the cap), a
 * shared anonymous one of 1 MiB yes (kind shared). Each is written and
 * read back. "ok". */
#include "common.h"
#include <sys/mman.h>

static char *map(size_t n, int prot, int flags)
{
	char *p = mmap(NULL, n, prot, flags, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

int main(void)
{
	const int priv = MAP_PRIVATE | MAP_ANONYMOUS;
	char *a = map(60 << 10, PROT_READ | PROT_WRITE, priv);
	char *b = map(64 << 10, PROT_READ | PROT_WRITE, priv);
	char *c = map(1 * MiB, PROT_READ | PROT_WRITE, priv);
	char *d = map(65ull << 30, PROT_NONE, priv | MAP_NORESERVE);
	char *e = map(1 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS);
	fill(a, 60 << 10, 1);
	fill(b, 64 << 10, 2);
	fill(c, 1 * MiB, 3);
	if (mprotect(d, 1 * MiB, PROT_READ | PROT_WRITE))
		die("mprotect");
	fill(d, 1 * MiB, 4);
	fill(e, 1 * MiB, 5);
	if (!check(a, 60 << 10, 1) || !check(b, 64 << 10, 2) || !check(c, 1 * MiB, 3) || !check(d, 1 * MiB, 4) ||
	    !check(e, 1 * MiB, 5))
		die("contents");
	say("ok\n");
	return 0;
}
