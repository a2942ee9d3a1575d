// fork MIB: allocates MIB mebibytes with malloc, writes a pattern into
// every 8-byte word (with MIB well above the agent's budget, most of it is
// evicted), then forks. Parent and child each check that they see the
// pattern, write their own values to the same addresses, wait for the other
// to have written too, and read back their own values, page by page in a
// permuted order. The child says "child ok"; the parent then says
// "parent ok". Exit status: 0 both right, 1 a word is wrong, 2 bad use or a
// system call failed.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE_WORDS 512

static uint64_t pat(uint64_t i) { return i * 0x9E3779B97F4A7C15ull + 1; }

static size_t pages, stride;
static uint64_t *p;

// check verifies every word against pat(i) ^ tag, pages in permuted order.
static int check(const char *who, uint64_t tag) {
	for (size_t k = 0; k < pages; k++) {
		size_t pg = (k * stride) % pages;
		for (size_t j = 0; j < PAGE_WORDS; j++) {
			uint64_t i = pg * PAGE_WORDS + j;
			if (p[i] != (pat(i) ^ tag)) {
				fprintf(stderr, "%s: word %zu: %016llx, want %016llx\n", who, (size_t)i,
					(unsigned long long)p[i], (unsigned long long)(pat(i) ^ tag));
				return 1;
			}
		}
	}
	return 0;
}

static void fill(uint64_t tag) {
	for (size_t i = 0; i < pages * PAGE_WORDS; i++)
		p[i] = pat(i) ^ tag;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: fork MIB\n");
		return 2;
	}
	pages = ((size_t)atol(argv[1]) << 20) / 4096;
	stride = pages / 2 + pages / 8 + 1; // odd: a permutation of a power of two
	p = malloc(pages * 4096);
	if (!p) {
		perror("malloc");
		return 2;
	}
	fill(0);
	int toChild[2], toParent[2];
	if (pipe(toChild) || pipe(toParent)) {
		perror("pipe");
		return 2;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 2;
	}
	char b = 'x';
	if (pid == 0) {
		if (check("child before writing", 0))
			_exit(1);
		fill(0x2222222222222222ull);
		if (write(toParent[1], &b, 1) != 1 || read(toChild[0], &b, 1) != 1)
			_exit(2);
		if (check("child", 0x2222222222222222ull))
			_exit(1);
		printf("child ok\n");
		fflush(stdout);
		_exit(0);
	}
	if (check("parent before writing", 0))
		return 1;
	fill(0x1111111111111111ull);
	if (write(toChild[1], &b, 1) != 1 || read(toParent[0], &b, 1) != 1) {
		fprintf(stderr, "parent: the child went away\n");
		waitpid(pid, NULL, 0);
		return 2;
	}
	int bad = check("parent", 0x1111111111111111ull);
	int st;
	if (waitpid(pid, &st, 0) != pid) {
		perror("waitpid");
		return 2;
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "child: status %#x\n", st);
		return 1;
	}
	if (bad)
		return 1;
	printf("parent ok\n");
	free(p);
	return 0;
}
