/* libplug.so, the library the dlopen test loads: its constructor allocates and
 * registers atfork handlers, it returns memory the program frees. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static char *greeting;
static int forks;

static void count(void) { forks++; }

__attribute__((constructor)) static void init(void)
{
	greeting = strdup("hello from the plug-in");
	pthread_atfork(NULL, count, NULL);
}

__attribute__((destructor)) static void fini(void) { free(greeting); }

const char *plug_greeting(void) { return greeting; }
int plug_forks(void) { return forks; }

char *plug_make(size_t n, int c)
{
	char *p = malloc(n);
	if (p)
		memset(p, c, n);
	return p;
}
