/* A library whose constructor registers atfork handlers before the
 * program makes its first allocation: they run inside the shim's fork
 * window (after its prepare handler, before its parent and child ones),
 * where the embedded jemalloc's locks are held. Their allocations must come
 * from glibc and their frees of jemalloc's blocks wait: either would
 * deadlock otherwise. The program (early.c) hands over a block to free and
 * reads what the handlers allocated through the functions below. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static char *pre_fork, *in_prepare, *in_parent, *in_child;

/* p (the program's, jemalloc's) is freed by the next prepare handler. */
void early_hand_over(char *p) { pre_fork = p; }

/* Whether the prepare handler freed the block handed over. */
int early_freed(void) { return pre_fork == NULL; }

/* The prepare handler's block: grown by the parent handler in the parent. */
char *early_block(int parent) { return parent ? in_parent : in_prepare; }

/* The child handler's block. */
char *early_child_block(void) { return in_child; }

static void prepare(void)
{
	in_prepare = malloc(3 << 20);
	if (in_prepare)
		memset(in_prepare, 0x11, 3 << 20);
	char *s = strdup("freed in the prepare handler");
	free(s);
	free(pre_fork); /* jemalloc's: deferred until its locks are free */
	pre_fork = NULL;
}

static void parent(void)
{
	in_parent = realloc(in_prepare, 4 << 20);
	in_prepare = NULL;
}

static void child(void)
{
	in_child = calloc(1, 200);
}

__attribute__((constructor)) static void init(void) { pthread_atfork(prepare, parent, child); }
