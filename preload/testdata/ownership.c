/* Pointers that glibc's own malloc made reach the shim's free, realloc
 * and malloc_usable_size in glibc mode and must go back to glibc (the
 * embedded jemalloc would crash on them): blocks from __libc_malloc, and
 * what libc allocates for the program through malloc (threads' TLS,
 * dlerror's message, stdio, getline) must work too. */
#include "common.h"
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_memalign(size_t, size_t);

static int token;
static void *thread(void *arg) { return arg; }

int main(void)
{
	for (int i = 0; i < 100; i++) {
		char *g = __libc_malloc(100 + i);
		if (!g || malloc_usable_size(g) < 100u + i)
			die("malloc_usable_size of glibc's block");
		memset(g, 1, 100 + i);
		free(g);
	}
	char *g = __libc_malloc(1000);
	fill(g, 1000, 5);
	g = realloc(g, 300000); /* moves into the shim's heap */
	if (!g || !check(g, 1000, 5) || malloc_usable_size(g) < 300000)
		die("realloc of glibc's block");
	free(g);
	g = __libc_calloc(10, 10);
	g = realloc(g, 50);
	free(g);
	free(__libc_memalign(4096, 5000));
	for (int i = 0; i < 50; i++) {
		pthread_t t;
		void *r;
		if (pthread_create(&t, NULL, thread, &token) || pthread_join(t, &r) || r != &token)
			die("thread");
	}
	if (dlsym(RTLD_DEFAULT, "rmem_no_such_symbol") || !dlerror())
		die("dlerror");
	FILE *f = fmemopen(NULL, 4096, "w+");
	if (!f || fprintf(f, "line one\nline two\n") < 0)
		die("fmemopen");
	rewind(f);
	char *line = NULL;
	size_t cap = 0;
	if (getline(&line, &cap, f) != 9 || strcmp(line, "line one\n"))
		die("getline");
	free(line);
	fclose(f);
	say("ok\n");
	return 0;
}
