// Probe for issue 34 (misses served in the faulting thread): the floor of
// a miss served through the fault ring on this machine, piece by piece,
// with nothing of rmem's running:
//  A. the faulting thread resolves its own fault (UFFD_FEATURE_SIGBUS,
//     UFFDIO_COPY in its SIGBUS handler): the trap, the signal and the
//     install, the least any SIGBUS design can cost;
//  B. another process (the agent's place, sharing the uffd) installs the
//     page while the thread waits in its handler on a word in shared
//     memory, as the ring does: both spinning with pause; the thread
//     yielding at every look (as ring.c does); the same with a gettid(2)
//     per fault; the server making a poll(2) and a sched_yield(2) between
//     its looks (as the agent's loop did before it watched the ring's
//     counter). The server's UFFDIO_COPY is timed on its own too;
//  C. a loopback TCP round trip, a 64-byte request and a 4 KiB reply,
//     both sides spinning on non-blocking reads, then both blocking: the
//     least a miss over tcp adds.
// Measured 2026-12-07 (2 vCPU PVM guest, kernel 6.18, cpuidle driver
// none; two runs each): A 18.8-19.5 us p50; B 19.0-22.1 us, the copy
// 2.2-2.4 us; C 7.2-12.0 us spinning and 19.6-28.5 us blocking. The
// kernel's swap-in from zram, as w3-2-inthread's random reads see it,
// 12.7-16.8 us here.
// gcc -O2 -o /tmp/mf scripts/probes/miss-floor.c && /tmp/mf
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N 20000
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
static double lat[N], copies[N];
static void report(const char *what, double *v, int n)
{
	qsort(v, n, sizeof *v, cmp);
	printf("%-62s p50 %6.2f us  p90 %6.2f\n", what, v[n / 2], v[n * 9 / 10]);
}

/* the request word the faulting thread and the server share */
struct slot {
	volatile unsigned long addr;
	volatile int state; /* 0 free, 1 posted, 2 done, 9 stop */
	int ncopies;
};
static struct slot *S;
static int uf, mode;
static char *src;

enum { IN_THREAD, PAUSE, YIELD, YIELD_GETTID, SERVER_POLLS, MODES };
static const char *names[MODES] = {
	"A  the thread installs its own page",
	"B  another process installs; both pause",
	"B  another process installs; the thread yields",
	"B  the same, with a gettid(2) per fault",
	"B  the same, the server polls(2) and yields at each look",
};

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)uc;
	unsigned long a = (unsigned long)si->si_addr & ~4095ul;
	if (mode == IN_THREAD) {
		struct uffdio_copy c = {.dst = a, .src = (unsigned long)src, .len = 4096, .mode = UFFDIO_COPY_MODE_WP};
		ioctl(uf, UFFDIO_COPY, &c);
		return;
	}
	if (mode >= YIELD_GETTID)
		syscall(SYS_gettid);
	S->addr = a;
	__atomic_store_n(&S->state, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&S->state, __ATOMIC_ACQUIRE) != 2) {
		if (mode >= YIELD)
			syscall(SYS_sched_yield);
		else
			__builtin_ia32_pause();
	}
	S->state = 0;
}

static void serve(void)
{
	int efd = eventfd(0, 0);
	struct pollfd p = {efd, POLLIN, 0};
	for (;;) {
		int s;
		while ((s = __atomic_load_n(&S->state, __ATOMIC_ACQUIRE)) != 1) {
			if (s == 9) {
				report("   the server's UFFDIO_COPY alone", copies, S->ncopies);
				_exit(0);
			}
			if (mode == SERVER_POLLS) {
				poll(&p, 1, 0);
				syscall(SYS_sched_yield);
			} else {
				__builtin_ia32_pause();
			}
		}
		struct uffdio_copy c = {.dst = S->addr, .src = (unsigned long)src, .len = 4096, .mode = UFFDIO_COPY_MODE_WP};
		double t = now();
		ioctl(uf, UFFDIO_COPY, &c);
		if (S->ncopies < N)
			copies[S->ncopies++] = now() - t;
		__atomic_store_n(&S->state, 2, __ATOMIC_RELEASE);
	}
}

static void faults(void)
{
	size_t len = (size_t)N * 4096;
	for (mode = 0; mode < MODES; mode++) {
		char *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uf = syscall(SYS_userfaultfd, O_CLOEXEC);
		struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_SIGBUS};
		struct uffdio_register r = {.range = {(unsigned long)m, len},
					    .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
		if (uf < 0 || ioctl(uf, UFFDIO_API, &api) || ioctl(uf, UFFDIO_REGISTER, &r)) {
			perror("userfaultfd");
			exit(1);
		}
		S->state = 0;
		S->ncopies = 0;
		pid_t server = 0;
		if (mode != IN_THREAD && (server = fork()) == 0)
			serve();
		int n = 0;
		for (int i = 0; i < N; i++) { /* each page once, in a scattered order */
			volatile char *p = m + (size_t)((i * 7919ul) % N) * 4096;
			double t = now();
			(void)*p;
			lat[n++] = now() - t;
		}
		report(names[mode], lat, n);
		if (server) {
			S->state = 9;
			waitpid(server, 0, 0);
		}
		munmap(m, len);
		close(uf);
	}
}

static void read_all(int fd, char *b, int n, int spin)
{
	for (int got = 0; got < n;) {
		int r = recv(fd, b + got, n - got, spin ? MSG_DONTWAIT : 0);
		if (r > 0)
			got += r;
		else if (r == 0)
			exit(1);
	}
}

static void round_trips(int spin)
{
	enum { REQ = 64, REPLY = 4096 + 64 };
	static char b[8192];
	int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof a;
	if (bind(ls, (void *)&a, sizeof a) || getsockname(ls, (void *)&a, &l) || listen(ls, 1)) {
		perror("listen");
		exit(1);
	}
	pid_t server = fork();
	if (server == 0) {
		int s = accept(ls, 0, 0);
		setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		for (int i = 0; i < N; i++) {
			read_all(s, b, REQ, spin);
			send(s, b, REPLY, 0);
		}
		_exit(0);
	}
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, (void *)&a, sizeof a)) {
		perror("connect");
		exit(1);
	}
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	for (int i = 0; i < N; i++) {
		double t = now();
		send(c, b, REQ, 0);
		read_all(c, b, REPLY, spin);
		lat[i] = now() - t;
	}
	report(spin ? "C  loopback tcp round trip, 64 B / 4 KiB, both spinning"
		    : "C  loopback tcp round trip, 64 B / 4 KiB, both blocking",
	       lat, N);
	waitpid(server, 0, 0);
	close(c);
	close(ls);
}

int main(void)
{
	setvbuf(stdout, 0, _IONBF, 0);
	src = aligned_alloc(4096, 4096);
	memset(src, 7, 4096);
	S = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigaction(SIGBUS, &sa, 0);
	faults();
	round_trips(1);
	round_trips(0);
	return 0;
}
