/* Big blocks from whatever malloc is in front (glibc through the shim,
 * or jemalloc/tcmalloc mapping their own chunks). */
#include "common.h"

#define N 24
#define SIZE (2 * MiB + 512 * 1024)

int main(void)
{
	char *b[N];
	for (int i = 0; i < N; i++) {
		b[i] = malloc(SIZE);
		if (!b[i])
			die("malloc");
		fill(b[i], SIZE, 100 + i);
	}
	say("ready\n");
	wait_go();
	for (int i = 0; i < N; i++)
		if (!check(b[i], SIZE, 100 + i))
			die("contents after eviction");
	for (int i = 0; i < N; i++)
		free(b[i]);
	say("ok\n");
	return 0;
}
