// Probe for issue 36 (programs the shim cannot reach; shared memory), on
// this kernel:
//  A. a uffd made inside a process (as an injected userfaultfd(2) would)
//     taken by another process with pidfd_getfd(2); can that other process
//     UFFDIO_REGISTER ranges of the first one's memory, and serve its
//     faults (UFFDIO_COPY)? What does a fault cost served that way?
//  B. ptrace syscall injection: what one injected system call costs
//     (PTRACE_SEIZE, INTERRUPT, set regs at a syscall instruction, run to
//     the exit stop, restore).
//  C. shmem (memfd, MAP_SHARED) mapped by two processes, each registered
//     MISSING on its own uffd: a page installed by one (UFFDIO_COPY) is
//     seen by the other without a fault; a hole punched (FALLOC_FL_PUNCH_HOLE)
//     faults again in both; a mapping not registered (another process, or
//     a forked child without UFFD_FEATURE_EVENT_FORK) reads the hole as
//     zeros, and its read fills the hole with a zero page for every
//     process (what must never happen under rmem).
// Measured 2026-12-06 (2 vCPU guest, kernel 6.18): A registers and serves
// from the other process, p50 37.8 us (the server sleeping in read(2));
// B p50 44.2 us; C as described.
// gcc -O2 -o /tmp/ur uffd-remote.c && /tmp/ur
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PG 4096
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static void die(const char *w) { perror(w); exit(1); }

// ---- A: a uffd taken from another process
static void probe_a(void) {
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p)) die("pipe");
	enum { N = 2000 };
	pid_t pid = fork();
	if (pid == 0) {
		char *m = mmap(0, (size_t)N * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		int uffd = syscall(SYS_userfaultfd, O_CLOEXEC); // what an injected call would make
		struct { char *m; int fd; } msg = {m, uffd};
		write(c2p[1], &msg, sizeof msg);
		char go;
		read(p2c[0], &go, 1); // registered by the parent
		static double t[N];
		long sum = 0;
		for (int i = 0; i < N; i++) {
			double t0 = now();
			sum += m[(size_t)i * PG];
			t[i] = now() - t0;
		}
		qsort(t, N, sizeof t[0], cmpd);
		printf("A. faults of a child served by its parent through the child's own uffd (taken with pidfd_getfd, registered by the parent): p50 %.1f us p99 %.1f us (sum %ld)\n", t[N / 2], t[N * 99 / 100], sum);
		fflush(stdout);
		_exit(0);
	}
	struct { char *m; int fd; } msg;
	read(c2p[0], &msg, sizeof msg);
	int pidfd = syscall(SYS_pidfd_open, pid, 0);
	int uffd = syscall(SYS_pidfd_getfd, pidfd, msg.fd, 0);
	if (pidfd < 0 || uffd < 0) die("pidfd_getfd");
	struct uffdio_api api = {.api = UFFD_API};
	if (ioctl(uffd, UFFDIO_API, &api)) die("UFFDIO_API (from the parent)");
	struct uffdio_register reg = {.range = {(uintptr_t)msg.m, (uint64_t)N * PG}, .mode = UFFDIO_REGISTER_MODE_MISSING};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		printf("A. UFFDIO_REGISTER of the child's range by the parent: %s\n", strerror(errno));
		kill(pid, SIGKILL);
		waitpid(pid, 0, 0);
		return;
	}
	printf("A. UFFDIO_API and UFFDIO_REGISTER of the child's range from the parent: ok\n");
	fflush(stdout);
	write(p2c[1], "g", 1);
	static char page[PG];
	memset(page, 7, PG);
	for (int served = 0; served < N;) {
		struct uffd_msg m;
		if (read(uffd, &m, sizeof m) != sizeof m) continue; // blocking read: the cross-process wake-up
		if (m.event != UFFD_EVENT_PAGEFAULT) continue;
		struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(uint64_t)(PG - 1), .src = (uintptr_t)page, .len = PG};
		if (ioctl(uffd, UFFDIO_COPY, &c)) die("UFFDIO_COPY");
		served++;
	}
	waitpid(pid, 0, 0);
}

// ---- B: ptrace syscall injection
static void probe_b(void) {
	pid_t pid = fork();
	if (pid == 0) {
		for (;;) pause();
	}
	usleep(10000);
	if (ptrace(PTRACE_SEIZE, pid, 0, 0)) die("PTRACE_SEIZE");
	enum { N = 500 };
	static double t[N];
	for (int i = 0; i < N; i++) {
		double t0 = now();
		if (ptrace(PTRACE_INTERRUPT, pid, 0, 0)) die("INTERRUPT");
		int st;
		waitpid(pid, &st, 0);
		struct user_regs_struct saved, r;
		ptrace(PTRACE_GETREGS, pid, 0, &saved);
		r = saved;
		// In pause(): rip is just past a syscall instruction (2 bytes).
		r.rip = saved.rip - 2;
		r.rax = SYS_getpid;
		r.orig_rax = -1;
		ptrace(PTRACE_SETREGS, pid, 0, &r);
		ptrace(PTRACE_SYSCALL, pid, 0, 0); // to the entry stop
		waitpid(pid, &st, 0);
		ptrace(PTRACE_SYSCALL, pid, 0, 0); // to the exit stop
		waitpid(pid, &st, 0);
		ptrace(PTRACE_GETREGS, pid, 0, &r);
		if ((long)r.rax != pid) { fprintf(stderr, "B. injected getpid returned %lld\n", (long long)r.rax); break; }
		ptrace(PTRACE_SETREGS, pid, 0, &saved); // back into pause (restarted)
		ptrace(PTRACE_CONT, pid, 0, 0);
		t[i] = now() - t0;
	}
	qsort(t, N, sizeof t[0], cmpd);
	printf("B. one system call injected with ptrace (interrupt, regs, entry and exit stops, restore): p50 %.1f us p99 %.1f us\n", t[N / 2], t[N * 99 / 100]);
	kill(pid, SIGKILL);
	waitpid(pid, 0, 0);
}

// ---- C: shmem shared by two processes
static int mkuffd(void *m, size_t len) {
	int u = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = {.api = UFFD_API};
	struct uffdio_register reg = {.range = {(uintptr_t)m, len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
	if (u < 0 || ioctl(u, UFFDIO_API, &api) || ioctl(u, UFFDIO_REGISTER, &reg)) die("uffd on shmem");
	return u;
}
static int serve_one(int u, char fill) { // one fault, if any, served with pages of fill
	struct pollfd p = {.fd = u, .events = POLLIN};
	if (poll(&p, 1, 200) <= 0) return 0;
	struct uffd_msg m;
	if (read(u, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT) return 0;
	static char page[PG];
	memset(page, fill, PG);
	struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(uint64_t)(PG - 1), .src = (uintptr_t)page, .len = PG};
	if (ioctl(u, UFFDIO_COPY, &c)) die("UFFDIO_COPY shmem");
	return 1;
}
static void *reader(void *a) { return (void *)(uintptr_t)(unsigned char)*(volatile char *)a; }
// read *p in a thread of this process (its faults go to this process's uffd)
static pthread_t read_in_thread(char *p) { pthread_t t; pthread_create(&t, 0, reader, p); return t; }
static int joined(pthread_t t) { void *v; pthread_join(t, &v); return (int)(uintptr_t)v; }
static void probe_c(void) {
	int fd = memfd_create("probe", MFD_CLOEXEC);
	ftruncate(fd, 4 * PG);
	int c2p[2], p2c[2];
	pipe(c2p), pipe(p2c);
	pid_t pid = fork();
	if (pid == 0) { // process 2: its own mapping of the segment, its own uffd
		char *m2 = mmap(0, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		int u2 = mkuffd(m2, 4 * PG);
		char b;
		read(p2c[0], &b, 1);            // process 1 installed page 0
		pthread_t t = read_in_thread(m2); // no fault expected
		int f = serve_one(u2, 9);
		int v0 = joined(t);
		read(p2c[0], &b, 1); // process 1 punched page 0 out
		t = read_in_thread(m2);
		int f2 = serve_one(u2, 9);
		int v1 = joined(t);
		char res[4] = {(char)v0, (char)f, (char)f2, (char)v1};
		write(c2p[1], res, 4);
		_exit(0);
	}
	char *m = mmap(0, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int u = mkuffd(m, 4 * PG);
	usleep(50000);
	pthread_t t = read_in_thread(m);
	int f1 = serve_one(u, 5);
	int v = joined(t);
	write(p2c[1], "a", 1);
	usleep(100000);
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, PG)) die("punch");
	write(p2c[1], "b", 1);
	char res[4];
	read(c2p[0], res, 4);
	waitpid(pid, 0, 0);
	// a process that maps the segment without a uffd, after another punch
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, PG)) die("punch");
	pid_t q = fork();
	if (q == 0) { char *m3 = mmap(0, 4 * PG, PROT_READ, MAP_SHARED, fd, 0); _exit(m3[0]); }
	int st;
	waitpid(q, &st, 0);
	// a forked child of a registered process (no UFFD_FEATURE_EVENT_FORK)
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, PG)) die("punch");
	pid_t q2 = fork();
	if (q2 == 0) _exit(m[0]);
	int st2;
	waitpid(q2, &st2, 0);
	int faulted = serve_one(u, 5);
	pthread_t t2 = read_in_thread(m); // process 1 itself, after the child's read of the hole
	int f3 = serve_one(u, 5);
	int v3 = joined(t2);
	printf("C. shmem in two processes, each its own uffd: process 1's fault served (%d, byte %d); process 2 read it without a fault (faults %d, byte %d); after a hole punch process 2 faulted to its uffd (%d) and read %d; an unregistered mapping of the hole reads %d; a forked child of process 1 reads the hole as %d (a fault to process 1's uffd: %d); then process 1 reads %d with %d faults (the child's read filled the hole with zeros for every process)\n",
	       f1, v, res[1], res[0], res[2], res[3], WEXITSTATUS(st), WEXITSTATUS(st2), faulted, v3, f3);
}

int main(void) {
	probe_a();
	probe_b();
	probe_c();
	return 0;
}
