/* fork() in a process that lost its agent (orphaned: none came back within
 * RMEM_AGENT_WAIT; or off: the shim dropped it after a malformed packet)
 * while a region of it has pages in the pool. The child must not touch
 * its parent's address space through the uffd it inherited: ioctls on a
 * uffd act on the process that made it, so the child unmapping the region
 * once unregistered it in the parent, whose pooled pages then read as
 * zeros. And the child must get its own memory right: its resident pages
 * exact, its pooled ones SIGBUS, never zeros.
 *
 * A region R of 4 MiB (an mmap), its first half resident, its second half
 * to be evicted by the test, and (memory only) a malloc'd block H, resident:
 * in glibc mode the heap's regions, which a child that did not inherit
 * them could not even return from fork() without (jemalloc's fork handler
 * reads its arenas there). Protocol with the test: "ready <R>" (evict
 * R's second half, lose the agent), go; then the child does argv[1]:
 *
 *   unmap    munmap(R), exit 0;
 *   memory   reads R's first half and H ("child resident ok"), maps new
 *            memory ("child new memory ok"), unmaps the first half,
 *            then reads R's second half: SIGBUS is right;
 *
 * and the parent says "child exited N" or "child SIGxxx", then "parent
 * resident ok" (R's first half and H) and "parent reads pooled", and reads
 * R's second half: SIGBUS (orphaned), or "parent pooled exact" (off: the
 * agent, never told, still serves the uffd) are right, "FAIL" with the
 * word it found is not. LOSTFORK_NO_PTRACE=1: see drop_ptrace. */
#include "common.h"
#include <linux/capability.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define SIZE (4 * MiB)
#define HALF (SIZE / 2)

/* LOSTFORK_NO_PTRACE=1: the process drops CAP_SYS_PTRACE, which
 * UFFD_FEATURE_EVENT_FORK needs, so that the shim's uffd has no FORK
 * events (as an ordinary user's). Before main, so before the shim
 * connects (at the first region). */
__attribute__((constructor)) static void drop_ptrace(void)
{
	const char *e = getenv("LOSTFORK_NO_PTRACE");
	if (!e || strcmp(e, "1"))
		return;
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d))
		die("capget");
	d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
	d[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
	if (syscall(SYS_capset, &h, d))
		die("capset");
}

/* Whether the first word of R's page at offset i is fill()'s, or SIGBUS. */
static int page_ok(const char *r, size_t i)
{
	return *(const volatile uint64_t *)(r + i) == 1 * 0x9e3779b97f4a7c15ull + i / 8;
}

static void child_memory(char *r, char *h)
{
	if (!check(r, HALF, 1) || !check(h, MiB, 3))
		die("the child's resident pages are wrong");
	say("child resident ok\n");
	/* New memory is ordinary memory. (Not malloc's in glibc mode: the
	 * heap's regions are guarded whole, and a page of them that was
	 * never touched raises SIGBUS as a pooled one does.) */
	char *q = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED)
		die("mmap in the child");
	fill(q, 2 * MiB, 6);
	if (!check(q, 2 * MiB, 6))
		die("the child's new memory");
	munmap(q, 2 * MiB);
	say("child new memory ok\n");
	if (munmap(r, HALF))
		die("munmap in the child");
	/* Pooled pages: SIGBUS, never zeros. */
	for (size_t i = HALF; i < SIZE; i += 4096)
		if (!page_ok(r, i)) {
			char line[96];
			snprintf(line, sizeof line, "FAIL: the child read %#lx at R+%#zx\n", *(unsigned long *)(r + i), i);
			say(line);
			_exit(1);
		}
	say("FAIL: the child read its pooled pages\n");
	_exit(1);
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "unmap") && strcmp(argv[1], "memory")))
		die("usage: lostfork unmap|memory");
	char *r = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED)
		die("mmap");
	fill(r, SIZE, 1);
	int memory = !strcmp(argv[1], "memory");
	char *h = memory ? malloc(MiB) : NULL;
	if (memory && !h)
		die("malloc");
	if (memory)
		fill(h, MiB, 3);
	char line[96];
	snprintf(line, sizeof line, "ready %p\n", (void *)r);
	say(line);
	wait_go();
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (!memory)
			_exit(munmap(r, SIZE) ? 2 : 0);
		child_memory(r, h);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	if (WIFSIGNALED(st))
		snprintf(line, sizeof line, "child SIG%s\n", sigabbrev_np(WTERMSIG(st)) ? sigabbrev_np(WTERMSIG(st)) : "?");
	else
		snprintf(line, sizeof line, "child exited %d\n", WEXITSTATUS(st));
	say(line);
	if (!check(r, HALF, 1) || (memory && !check(h, MiB, 3)))
		die("the parent's resident pages are wrong");
	say("parent resident ok\n");
	say("parent reads pooled\n");
	for (size_t i = HALF; i < SIZE; i += 4096)
		if (!page_ok(r, i)) {
			snprintf(line, sizeof line, "FAIL: the parent read %#lx at R+%#zx\n", *(unsigned long *)(r + i), i);
			say(line);
			return 1;
		}
	say("parent pooled exact\n");
	return 0;
}
