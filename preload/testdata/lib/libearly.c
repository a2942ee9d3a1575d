/* A library whose constructor registers atfork handlers before the
 * program makes its first allocation: they run inside the shim's fork
 * window (after its prepare handler, before its parent and child ones),
 * where the embedded jemalloc's locks are held. Their allocations must come
 * from glibc and their frees of jemalloc's blocks wait: either would
 * deadlock otherwise. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

char *early_pre_fork, *early_in_prepare, *early_in_parent, *early_in_child;

static void prepare(void)
{
	early_in_prepare = malloc(3 << 20);
	if (early_in_prepare)
		memset(early_in_prepare, 0x11, 3 << 20);
	char *s = strdup("freed in the prepare handler");
	free(s);
	free(early_pre_fork); /* jemalloc's: deferred until its locks are free */
	early_pre_fork = NULL;
}

static void parent(void)
{
	early_in_parent = realloc(early_in_prepare, 4 << 20);
	early_in_prepare = NULL;
}

static void child(void)
{
	early_in_child = calloc(1, 200);
}

__attribute__((constructor)) static void init(void) { pthread_atfork(prepare, parent, child); }
