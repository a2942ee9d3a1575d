/* A program the shim cannot reach (built with gcc -static), for
 * TestRunStatic: it pages 4x its budget and does what the tracer follows —
 * malloc's mmap'd chunks and brk heap, a realloc whose mremap is refused,
 * madvise(MADV_DONTNEED), threads, its own SIGSEGV handler, fork and
 * exec — and checks every byte. Prints "OK <sum>" and exits 0, or says
 * what broke and exits 1. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1u << 20)
static uint64_t *a;
static size_t n;
static uint64_t val(size_t i) { return i * 0x9E3779B97F4A7C15ull + 7; }
static int fail(const char *what, size_t i) { printf("BAD %s at %zu\n", what, i); exit(1); }
static void check(size_t from, size_t to) { for (size_t i = from; i < to; i++) if (a[i] != val(i)) fail("array", i); }
static void *reader(void *arg) {
	uint64_t x = (uintptr_t)arg * 2654435761u + 1;
	for (int k = 0; k < 20000; k++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; size_t i = x % n; if (a[i] != val(i)) fail("thread read", i); }
	return 0;
}
static sigjmp_buf jb;
static void onsegv(int s) { (void)s; siglongjmp(jb, 1); }

int main(int argc, char **argv) {
	if (argc > 1 && !strcmp(argv[1], "spin")) { /* pages until killed */
		n = 16 * MB / 8; a = malloc(n * 8);
		for (;;) for (size_t i = 0; i < n; i += 512) a[i]++;
	}
	if (argc > 1 && !strcmp(argv[1], "exec")) { /* the image after exec: paged anew */
		n = 8 * MB / 8; a = malloc(n * 8);
		for (size_t i = 0; i < n; i++) a[i] = val(i);
		check(0, n);
		printf("exec OK\n");
		return 0;
	}
	n = 16 * MB / 8;
	a = malloc(n * 8);
	for (size_t i = 0; i < n; i++) a[i] = val(i);
	/* realloc of an mmap'd chunk: mremap would move it (refused), glibc copies */
	a = realloc(a, (n + n / 4) * 8);
	for (size_t i = n; i < n + n / 4; i++) a[i] = val(i);
	n += n / 4;
	check(0, n);
	/* many small blocks: glibc's brk heap */
	enum { S = 20000 };
	static char *small[S];
	for (int i = 0; i < S; i++) { small[i] = malloc(1000); memset(small[i], i & 0xff, 1000); }
	/* dropped pages read back as zeros, never as the pool's old copies */
	char *p = (char *)(((uintptr_t)a + 3 * MB) & ~(uintptr_t)4095);
	if (madvise(p, 64 * 4096, MADV_DONTNEED)) fail("madvise", 0);
	for (size_t i = 0; i < 64 * 4096; i++) if (p[i]) fail("dropped page not zero", i);
	size_t lo = ((uintptr_t)p - (uintptr_t)a) / 8, hi = lo + 64 * 4096 / 8;
	for (size_t i = lo; i < hi; i++) a[i] = val(i);
	/* threads faulting at once */
	pthread_t th[4];
	for (int i = 0; i < 4; i++) pthread_create(&th[i], 0, reader, (void *)(uintptr_t)i);
	for (int i = 0; i < 4; i++) pthread_join(th[i], 0);
	/* its own SIGSEGV handler */
	struct sigaction sa = {0};
	sa.sa_handler = onsegv;
	sigaction(SIGSEGV, &sa, 0);
	char *pn = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	volatile int caught = 0;
	if (!sigsetjmp(jb, 1)) pn[0] = 1; else caught = 1;
	if (!caught) fail("SIGSEGV handler", 0);
	for (int i = 0; i < S; i++) for (int j = 0; j < 1000; j++) if (small[i][j] != (char)(i & 0xff)) fail("small block", i);
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++) sum += a[i];
	/* fork: the child gets every page */
	pid_t c = fork();
	if (c == 0) { /* paged on its own: its copy, then its own writes */
		check(0, n);
		for (size_t i = 0; i < n; i++) a[i] = val(i) + 1;
		for (size_t i = 0; i < n; i++) if (a[i] != val(i) + 1) fail("child's write", i);
		_exit(0);
	}
	int ws;
	waitpid(c, &ws, 0);
	if (!WIFEXITED(ws) || WEXITSTATUS(ws)) fail("forked child", ws);
	check(0, n); /* the child's writes are its own */
	printf("OK %llu\n", (unsigned long long)sum);
	fflush(stdout);
	execl("/proc/self/exe", argv[0], "exec", (char *)0);
	fail("exec", 0);
}
