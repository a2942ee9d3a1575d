// Probe for issue 34: why the agent's UFFDIO_COPY into a running program
// costs 8-9 us at p50 on this machine when the same ioctl from one C
// process into another costs 2-3 us (miss-floor.c).
//
// The agent's pattern without the agent: a program reads random pages of a
// 128 MiB heap with a quarter of it resident; a miss raises SIGBUS
// (UFFD_FEATURE_SIGBUS, the features the shim asks for), its handler posts
// the address in shared memory and spins; another process (the agent's
// place, with the program's uffd) installs the page with UFFDIO_COPY (timed)
// and says done; every 128 misses the program drops 128 random resident
// pages with one process_madvise (one TLB flush, as the shim's helper does).
// What is varied, by environment variable, one run each:
//   (none)  the installer alone on vCPU 0, the program alone on vCPU 1;
//   HOG=1   a process that does nothing but sched_yield(2) shares vCPU 1
//           with the program (the program is switched out and in);
//   SAME=1  the program on vCPU 0 with the installer, both yielding;
//   FLIP=N  the program visits vCPU 0 every N misses;
//   SELF=1  the installer only copies the page into a shared staging page
//           and the faulting thread installs it itself, from its handler.
// Measured 2026-12-07 (2 vCPU PVM guest under Firecracker, kernel 6.18,
// cpuidle driver none), install p50 / p90, miss p50:
//   alone 3.2-3.4 / 7.4-8.6 us, miss 22-27 us; HOG 8.2-11.3 / 9.8-13.2,
//   54-61; SAME 6.8 / 7.8-8.9, 44-45; FLIP=64 7.3-8.2 / 9.1-9.9, 26-28;
//   FLIP=1024 3.3-3.4 / 8.5-9.0, 23; SELF 2.4-2.6 / 6.7-7.4, 21-22; SELF
//   with FLIP=64 6.4-6.5 / 7.5-7.8, 25.
// So an install is slow when the program's threads share their vCPU with
// another process (and so when they migrate often): every switch back to
// the program appears to resynchronise the hypervisor's shadow of its page
// tables, and the next write to each page-table page traps. Who installs
// does not matter (SELF). In rmem over shm, agent and memd pinned to one
// vCPU and the program to the other took the agent's install from 9.2 to
// 5.3-5.5 us, though not the miss as a whole (agent and memd then shared
// a vCPU).
// gcc -O2 -pthread -o /tmp/ic scripts/probes/install-cost.c && /tmp/ic
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SZ (128ul << 20)
#define NP (SZ / 4096)
#define B 128
#define MISSES 100000
#define PIDFD_SELF_THREAD (-10000)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}
static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}
static uint64_t x = 88172645463325252ull;
static uint64_t rnd(void)
{
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x;
}

/* shared by the program and the installer */
struct shared {
	volatile unsigned long addr;
	volatile int state; /* 0 free, 1 posted, 2 done */
	int n;
	double install[MISSES], miss[MISSES];
};
static struct shared *S;
static char *heap, *staging, *src;
static int uffd, self, yield_wait;
static unsigned char resident[NP];
static unsigned long list[NP];
static long nres;

static void relax(void)
{
	if (yield_wait)
		sched_yield();
	else
		__builtin_ia32_pause();
}

static void install(int fd, unsigned long dst, const char *from, double *lat)
{
	struct uffdio_copy c = {.dst = dst, .src = (unsigned long)from, .len = 4096, .mode = UFFDIO_COPY_MODE_WP};
	double t = now();
	ioctl(fd, UFFDIO_COPY, &c);
	*lat = now() - t;
}

static void onbus(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)uc;
	S->addr = (unsigned long)si->si_addr & ~4095ul;
	__atomic_store_n(&S->state, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&S->state, __ATOMIC_ACQUIRE) != 2)
		relax();
	if (self) {
		install(uffd, S->addr, staging, &S->install[S->n % MISSES]);
		S->n++;
	}
	S->state = 0;
}

static void pin(int cpu)
{
	cpu_set_t c;
	CPU_ZERO(&c);
	CPU_SET(cpu, &c);
	sched_setaffinity(0, sizeof c, &c);
}

static void installer(void)
{
	pin(0);
	for (int n = 0;; n = (n + 1) % MISSES) {
		while (__atomic_load_n(&S->state, __ATOMIC_ACQUIRE) != 1)
			relax();
		if (self)
			memcpy(staging, src, 4096);
		else
			install(uffd, S->addr, src, &S->install[n]);
		__atomic_store_n(&S->state, 2, __ATOMIC_RELEASE);
	}
}

int main(void)
{
	self = getenv("SELF") != NULL;
	int same = getenv("SAME") != NULL, hog = getenv("HOG") != NULL;
	int flip = getenv("FLIP") ? atoi(getenv("FLIP")) : 0;
	yield_wait = same || hog;

	heap = mmap(0, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	madvise(heap, SZ, MADV_NOHUGEPAGE);
	int mfd = memfd_create("shared", 0);
	size_t off = (sizeof *S + 4095) / 4096 * 4096;
	if (ftruncate(mfd, off + 4096))
		return 1;
	S = mmap(0, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	staging = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, off);
	src = aligned_alloc(4096, 4096);
	memset(src, 7, 4096);

	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = {.api = UFFD_API,
				 .features = UFFD_FEATURE_SIGBUS | UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_EVENT_UNMAP |
					     UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID};
	struct uffdio_register reg = {.range = {(unsigned long)heap, SZ},
				      .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("userfaultfd");
		return 1;
	}
	double ignored;
	for (unsigned long i = 0; i < NP / 4; i++) {
		unsigned long p = rnd() % NP;
		if (!resident[p]) {
			install(uffd, (unsigned long)heap + p * 4096, src, &ignored);
			resident[p] = 1, list[nres++] = p;
		}
	}

	pid_t inst = fork();
	if (inst == 0) {
		installer(); /* the child shares the uffd (no FORK events) */
		_exit(0);
	}
	pid_t hogpid = 0;
	if (hog && (hogpid = fork()) == 0) {
		pin(1);
		for (;;)
			sched_yield();
	}
	pin(same ? 0 : 1);
	struct sigaction sa = {0};
	sa.sa_sigaction = onbus;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGBUS, &sa, 0);

	volatile char sink = 0;
	for (int misses = 0, since = 0; misses < MISSES;) {
		unsigned long p = rnd() % NP;
		double t = now();
		sink += heap[p * 4096];
		double e = now() - t;
		if (resident[p])
			continue;
		S->miss[misses++] = e;
		resident[p] = 1, list[nres++] = p;
		if (flip && misses % flip == 0) {
			pin(0);
			pin(1);
		}
		if (++since == B) {
			struct iovec iv[B];
			since = 0;
			for (int k = 0; k < B; k++) {
				long j = rnd() % nres;
				unsigned long q = list[j];
				list[j] = list[--nres];
				resident[q] = 0;
				iv[k] = (struct iovec){heap + q * 4096, 4096};
			}
			syscall(SYS_process_madvise, PIDFD_SELF_THREAD, iv, B, MADV_DONTNEED, 0);
		}
	}
	kill(inst, SIGKILL);
	if (hogpid)
		kill(hogpid, SIGKILL);
	while (wait(NULL) > 0)
		;
	qsort(S->install, MISSES, sizeof(double), cmp);
	qsort(S->miss, MISSES, sizeof(double), cmp);
	printf("install p50 %.2f p90 %.2f us; miss p50 %.2f p90 %.2f us\n", S->install[MISSES / 2],
	       S->install[MISSES * 9 / 10], S->miss[MISSES / 2], S->miss[MISSES * 9 / 10]);
	return 0;
}
