/* dlopen under the shim: a library whose constructor allocates and
 * registers atfork handlers, memory it returns freed by the program (also
 * after dlclose), forks with its handlers and after they are gone, and a
 * library of libc's (libm). argv[1]: the library to load. "ok". */
#include "common.h"
#include <dlfcn.h>
#include <sys/wait.h>

static void fork_and_wait(void)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		char *p = malloc(100000);
		free(p);
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: dlopen LIB");
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die(dlerror());
	const char *(*greeting)(void) = (const char *(*)(void))dlsym(h, "plug_greeting");
	int (*forks)(void) = (int (*)(void))dlsym(h, "plug_forks");
	char *(*make)(size_t, int) = (char *(*)(size_t, int))dlsym(h, "plug_make");
	if (!greeting || !forks || !make || strcmp(greeting(), "hello from the plug-in"))
		die("the plug-in's symbols");
	char *small = make(100, 1), *big = make(5 * MiB, 2);
	if (!small || !big || small[99] != 1 || big[5 * MiB - 1] != 2)
		die("the plug-in's memory");
	free(small);
	fork_and_wait();
	if (forks() != 1)
		die("the plug-in's atfork handler");
	if (dlclose(h))
		die("dlclose");
	if (big[0] != 2)
		die("memory after dlclose");
	free(big);
	fork_and_wait(); /* its handler is gone with it */
	void *m = dlopen("libm.so.6", RTLD_NOW);
	double (*cosine)(double) = m ? (double (*)(double))dlsym(m, "cos") : NULL;
	if (!cosine || cosine(0) != 1)
		die("libm");
	dlclose(m);
	say("ok\n");
	return 0;
}
