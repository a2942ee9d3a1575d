/* System calls whose buffers lie on paged-out pages, or on clean pages
 * the agent restored write-protected: exact results, never EFAULT (ring
 * mode makes a kernel access to such a page fail unless the shim's
 * wrappers make it present first; today's mode has the kernel wait for the
 * agent).
 *
 *   ringcalls calls   phases, each after the test evicted everything
 *                     (it says "ready", "step" or "<phase> ok", then waits
 *                     for "g"): io, sockets, stat, dir, wait, futex,
 *                     spawn, misc, altstack, and wp ("wp ok": the end) with the test agent
 *                     restoring pages write-protected (clean pages that
 *                     the kernel may not write).
 *   ringcalls churn   for the test evicting all the while: a mutex and a
 *                     condition variable in the heap handed between two
 *                     threads, a thread doing pipe I/O from and to heap
 *                     buffers, a thread sleeping with all signals blocked
 *                     in between reading the heap; ends at the test's go
 *                     (a byte on stdin) and says "ok".
 */
#include "common.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

#define N (8 * MiB)
static char *A, *C;

static void expect(const char *what, long got, long want, const void *x, const void *y, size_t len)
{
	if (got != want || (len && memcmp(x, y, len))) {
		fprintf(stderr, "FAIL %s: returned %ld (want %ld), errno %d%s\n", what, got, want, errno,
			got == want ? ", data differs" : "");
		exit(1);
	}
}

static void pattern(char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)(i * 31 + (size_t)seed);
}

/* The test evicts everything, then says go. */
static void step(void)
{
	say("step\n");
	wait_go();
}

static void phase(const char *name)
{
	char line[64];
	snprintf(line, sizeof line, "%s ok\n", name);
	say(line);
	wait_go();
}

static void io(void)
{
	int p[2];
	if (pipe(p))
		die("pipe");
	size_t len = 5 * 4096 + 123, off = 1 * MiB + 77;
	long w = write(p[1], A + off, len), r = read(p[0], C + off, len);
	expect("pipe write from / read into evicted pages", w + r, 2 * (long)len, A + off, C + off, len);
	char tmpl[] = "/tmp/rmem-ringcalls-XXXXXX";
	int fd = mkstemp(tmpl);
	unlink(tmpl);
	w = pwrite(fd, A + 3 * MiB, len, 0);
	r = pread(fd, C + 3 * MiB + 5, len, 0);
	expect("pwrite from / pread into evicted pages", w + r, 2 * (long)len, A + 3 * MiB, C + 3 * MiB + 5, len);
	struct iovec wv[3] = {{A + 4 * MiB, 4096}, {A + 5 * MiB + 9, 6000}, {A + 6 * MiB, 100}};
	struct iovec rv[3] = {{C + 4 * MiB + 1, 4096}, {C + 5 * MiB + 19, 6000}, {C + 6 * MiB + 3, 100}};
	w = writev(p[1], wv, 3);
	r = readv(p[0], rv, 3);
	expect("writev / readv over evicted pages", w + r, 2 * 10196, A + 4 * MiB, C + 4 * MiB + 1, 4096);
	expect("readv's second buffer", 0, 0, A + 5 * MiB + 9, C + 5 * MiB + 19, 6000);
	lseek(fd, 0, SEEK_SET);
	r = read(fd, C + 7 * MiB, len); /* a regular file, into evicted pages */
	expect("read of a file into evicted pages", r, (long)len, A + 3 * MiB, C + 7 * MiB, len);
	close(fd);
	close(p[0]);
	close(p[1]);
}

static void sockets(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair");
	long w = send(sv[0], A + 2 * MiB, 8192, 0), r = recv(sv[1], C + 2 * MiB + 7, 8192, MSG_WAITALL);
	expect("send from / recv into evicted pages", w + r, 16384, A + 2 * MiB, C + 2 * MiB + 7, 8192);
	/* sendmsg / recvmsg, the msghdr and iovec themselves on evicted pages */
	struct msghdr *m = (struct msghdr *)(A + 7 * MiB), *mr = (struct msghdr *)(C + 6 * MiB + 8192);
	struct iovec *iv = (struct iovec *)(A + 7 * MiB + 8192), *ir = (struct iovec *)(C + 6 * MiB + 3 * 4096);
	memset(m, 0, sizeof *m);
	memset(mr, 0, sizeof *mr);
	iv[0] = (struct iovec){A + 1 * MiB, 3000};
	ir[0] = (struct iovec){C + 1 * MiB + 8192, 3000};
	m->msg_iov = iv;
	m->msg_iovlen = 1;
	mr->msg_iov = ir;
	mr->msg_iovlen = 1;
	step();
	w = sendmsg(sv[0], m, 0);
	r = recvmsg(sv[1], mr, MSG_WAITALL);
	expect("sendmsg / recvmsg, headers and data on evicted pages", w + r, 6000, A + 1 * MiB, C + 1 * MiB + 8192, 3000);
	int ds[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, ds))
		die("socketpair");
	w = sendto(ds[0], A + 5 * MiB, 1000, 0, NULL, 0);
	r = recvfrom(ds[1], C + 5 * MiB + 4096 * 3, 1000, 0, NULL, NULL);
	expect("a datagram into evicted pages", w + r, 2000, A + 5 * MiB, C + 5 * MiB + 4096 * 3, 1000);
	close(sv[0]), close(sv[1]), close(ds[0]), close(ds[1]);
}

static void stats(void)
{
	struct stat ref, *st = (struct stat *)(C + 2 * MiB + 5 * 4096);
	if (stat("/proc/self/exe", &ref) != 0)
		die("stat");
	expect("stat into an evicted page", stat("/proc/self/exe", st), 0, &ref.st_ino, &st->st_ino, sizeof ref.st_ino);
	char *path = A + 3 * MiB + 100 * 4096; /* the path itself on an evicted page */
	strcpy(path, "/proc/self/exe");
	step(); /* (the test evicts the path's page) */
	expect("lstat of a path on an evicted page", lstat(path, st), 0, NULL, NULL, 0);
	struct statx *sx = (struct statx *)(C + 4 * MiB + 7 * 4096);
	expect("statx into an evicted page", statx(AT_FDCWD, "/proc/self/exe", 0, STATX_INO, sx), 0, &ref.st_ino,
	       &sx->stx_ino, sizeof ref.st_ino);
	int fd = open("/", O_RDONLY);
	struct stat *st2 = (struct stat *)(C + 7 * MiB + 9 * 4096);
	expect("fstat into an evicted page", fstat(fd, st2), 0, NULL, NULL, 0);
	close(fd);
}

static void dir(void)
{
	int fd = open("/", O_RDONLY | O_DIRECTORY);
	long n = syscall(SYS_getdents64, fd, C + 3 * MiB + 64 * 4096, 8192);
	long m = getdents64(fd, C + 3 * MiB + 80 * 4096, 8192);
	if (n <= 0 || m < 0)
		expect("getdents64 into evicted pages", n, 1, NULL, NULL, 0);
	close(fd);
}

static DIR *g_dir;
static void dir2(void)
{
	int k = 0;
	struct dirent *e;
	while ((e = readdir(g_dir)))
		k++;
	if (k < 3)
		expect("readdir with its DIR on evicted pages", k, 3, NULL, NULL, 0);
	closedir(g_dir);
}

static void waits(void)
{
	int p[2];
	if (pipe(p))
		die("pipe");
	if (write(p[1], "x", 1) != 1)
		die("write");
	struct pollfd *pf = (struct pollfd *)(C + 1 * MiB + 20 * 4096);
	pf->fd = p[0], pf->events = POLLIN, pf->revents = 0;
	step(); /* (evicted again, now that pf is written) */
	expect("poll with its pollfd on an evicted page", poll(pf, 1, 1000), 1, NULL, NULL, 0);
	fd_set *rs = (fd_set *)(C + 2 * MiB + 30 * 4096);
	FD_ZERO(rs);
	FD_SET(p[0], rs);
	struct timeval *tv = (struct timeval *)(C + 2 * MiB + 40 * 4096);
	tv->tv_sec = 1, tv->tv_usec = 0;
	step();
	expect("select with fd_set and timeval on evicted pages", select(p[0] + 1, rs, NULL, NULL, tv), 1, NULL, NULL, 0);
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 7};
	epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev);
	struct epoll_event *out = (struct epoll_event *)(C + 5 * MiB + 50 * 4096);
	long r = epoll_wait(ep, out, 4, 1000);
	if (r != 1 || out[0].data.u32 != 7)
		expect("epoll_wait into an evicted page", r, 1, NULL, NULL, 0);
	struct timespec *ts = (struct timespec *)(C + 6 * MiB + 60 * 4096);
	ts->tv_sec = 0, ts->tv_nsec = 1000;
	step();
	expect("nanosleep with its timespec on an evicted page", nanosleep(ts, NULL), 0, NULL, NULL, 0);
	close(ep), close(p[0]), close(p[1]);
}

static void futex(void)
{
	int *w = (int *)(A + 6 * MiB + 70 * 4096 + 12), v = *w;
	step(); /* (its page evicted) */
	struct timespec t = {0, 0};
	long r = syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v + 1, &t, NULL, 0);
	if (r != -1 || errno != EAGAIN)
		expect("a futex on an evicted word (EAGAIN: the value differs)", r, -1, NULL, NULL, 0);
	r = syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, &t, NULL, 0);
	if (r != -1 || errno != ETIMEDOUT)
		expect("a futex on an evicted word (ETIMEDOUT: the value is right)", r, -1, NULL, NULL, 0);
}

/* argv and environment strings on the heap, their pages evicted; the child
 * checks them: /bin/sh -c 'test "$0$1" = "argONEargTWO" && test "$RINGVAR" = ...'. */
static char **g_argv, **g_envp;
static void spawn_prepare(void)
{
	g_argv = malloc(6 * sizeof *g_argv);
	g_envp = malloc(3 * sizeof *g_envp);
	g_argv[0] = strdup("/bin/sh");
	g_argv[1] = strdup("-c");
	g_argv[2] = strdup("test \"$0$1\" = argONEargTWO && test \"$RINGVAR\" = ring-value-on-the-heap");
	g_argv[3] = strdup("argONE");
	g_argv[4] = strdup("argTWO");
	g_argv[5] = NULL;
	g_envp[0] = strdup("RINGVAR=ring-value-on-the-heap");
	g_envp[1] = strdup("PATH=/usr/bin:/bin");
	g_envp[2] = NULL;
}

static void spawn(void)
{
	pid_t pid;
	int st;
	int r = posix_spawn(&pid, "/bin/sh", NULL, NULL, g_argv, g_envp);
	if (r != 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		expect("posix_spawn with argv and envp on evicted pages (error, or the child's status)", r ? r : st, 0,
		       NULL, NULL, 0);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	step(); /* (the file actions evicted too) */
	r = posix_spawnp(&pid, "sh", &fa, NULL, g_argv, g_envp);
	if (r != 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		expect("posix_spawnp with file actions on evicted pages", r, 0, NULL, NULL, 0);
	posix_spawn_file_actions_destroy(&fa);
}

/* The execl family: a child runs /bin/sh with 5,000 arguments (no limit
 * but the kernel's, as without rmem), and with its argv and (execle) envp
 * strings on evicted pages. */
#define X10 "x", "x", "x", "x", "x", "x", "x", "x", "x", "x"
#define X100 X10, X10, X10, X10, X10, X10, X10, X10, X10, X10
#define X1000 X100, X100, X100, X100, X100, X100, X100, X100, X100, X100
static void execl_child(int which)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (which == 0)
			execl("/bin/sh", "sh", "-c", "test $# = 4999", X1000, X1000, X1000, X1000, X1000, (char *)NULL);
		else if (which == 1)
			execle("/bin/sh", g_argv[0], g_argv[1], g_argv[2], g_argv[3], g_argv[4], (char *)NULL, g_envp);
		else
			execlp("sh", g_argv[0], g_argv[1], g_argv[2], g_argv[3], g_argv[4], (char *)NULL);
		_exit(127);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		static const char *what[] = {"execl with 5,000 arguments", "execle with argv and envp on evicted pages",
					     "execlp with argv on evicted pages"};
		expect(what[which], st, 0, NULL, NULL, 0);
	}
}

static void execls(void)
{
	execl_child(0);
	step();
	execl_child(1);
	setenv("RINGVAR", "ring-value-on-the-heap", 1); /* execlp passes environ */
	step();
	execl_child(2);
}

static char *g_cmd;
static void sys(void)
{
	int st = system(g_cmd);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 7)
		expect("system() with its command on an evicted page", st, 7 << 8, NULL, NULL, 0);
	FILE *f = popen(g_cmd + 100, "r");
	char buf[32] = {0};
	if (!f || !fgets(buf, sizeof buf, f) || strcmp(buf, "popen ok\n") || pclose(f) != 0)
		expect("popen() with its command on an evicted page", 0, 1, NULL, NULL, 0);
}

/* Paths and small structs (kmisc.c): open and access of a path on an
 * evicted page, pipe and uname into evicted pages, fwrite and fread of
 * big requests from and into evicted pages. */
static void misc(void)
{
	char *path = A + 5 * MiB + 3 * 4096 + 17;
	strcpy(path, "/proc/self/exe");
	step(); /* (the test evicts the path's page) */
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		expect("open of a path on an evicted page", fd, 0, NULL, NULL, 0);
	close(fd);
	step();
	expect("access of a path on an evicted page", access(path, R_OK), 0, NULL, NULL, 0);
	int *fds = (int *)(C + 6 * MiB + 5 * 4096);
	expect("pipe into an evicted page", pipe(fds), 0, NULL, NULL, 0);
	close(fds[0]), close(fds[1]);
	struct utsname ref, *u = (struct utsname *)(C + 6 * MiB + 9 * 4096 + 100);
	uname(&ref);
	expect("uname into an evicted page", uname(u), 0, ref.sysname, u->sysname, sizeof ref.sysname);
	/* stdio passes a big request's buffer to the kernel itself */
	FILE *f = tmpfile();
	if (!f)
		die("tmpfile");
	size_t w = fwrite(A + 5 * MiB + 64 * 4096, 1, 65536, f);
	fflush(f);
	rewind(f);
	step();
	size_t r = fread(C + 6 * MiB + 32 * 4096 + 9, 1, 65536, f);
	expect("fwrite from / fread into evicted pages", (long)(w + r), 131072, A + 5 * MiB + 64 * 4096,
	       C + 6 * MiB + 32 * 4096 + 9, 65536);
	fclose(f);
}

/* A signal delivered on an alternate stack in the paged heap: the kernel
 * writes its frame there, which must be present and writable (pinned:
 * the test evicts everything between sigaltstack and the signal). */
static volatile uintptr_t g_onstack;
static void on_usr1(int sig)
{
	volatile char here = (char)sig;
	g_onstack = (uintptr_t)&here;
}

static void altstack(void)
{
	char *base = C + 7 * MiB + 128 * 1024;
	stack_t ss = {.ss_sp = base, .ss_size = 64 * 1024};
	if (sigaltstack(&ss, NULL))
		die("sigaltstack");
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_ONSTACK;
	sigaction(SIGUSR1, &sa, NULL);
	A[0]++; /* (something to evict but the stack) */
	step(); /* (the test evicts everything it may) */
	raise(SIGUSR1);
	if (g_onstack < (uintptr_t)base || g_onstack >= (uintptr_t)base + 64 * 1024)
		expect("a signal on an alternate stack in the paged heap", (long)g_onstack, (long)(uintptr_t)base, NULL,
		       NULL, 0);
	ss.ss_flags = SS_DISABLE;
	sigaltstack(&ss, NULL);
}

/* The test agent restores pages write-protected: a page read back is
 * clean and protected, and a kernel write into it fails without the
 * wrappers. */
static void wp(void)
{
	volatile char sink = 0;
	for (size_t i = 0; i < N; i += 4096)
		sink += C[i]; /* restored, clean, protected */
	(void)sink;
	int p[2];
	if (pipe(p))
		die("pipe");
	long w = write(p[1], A + 4096, 8192), r = read(p[0], C + 4096 + 5, 8192);
	expect("read into clean write-protected pages", w + r, 16384, A + 4096, C + 4096 + 5, 8192);
	struct stat *st = (struct stat *)(C + 2 * MiB + 77 * 4096);
	expect("fstat into a clean write-protected page", fstat(p[0], st), 0, NULL, NULL, 0);
	close(p[0]), close(p[1]);
}

/* ---- churn ---- */

struct pp {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int turn, left; /* left: 0 once the test said go */
	long rounds;
};

static void *pong(void *arg)
{
	struct pp *p = arg;
	pthread_mutex_lock(&p->mu);
	while (p->left > 0) {
		while (p->turn != 1 && p->left > 0)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->left <= 0)
			break;
		p->turn = 0;
		p->rounds++;
		pthread_cond_signal(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static volatile int stop;

static void *pipes(void *arg)
{
	(void)arg;
	int p[2];
	if (pipe(p))
		die("pipe");
	for (size_t k = 0; !stop; k++) {
		size_t off = (k * 40503 * 4096 + k * 17) % (N - 70000), len = 1 + (k * 7919) % 60000;
		long w = 0, r = 0, n;
		/* (A short count is a pipe's right; an error is not.) */
		while (w < (long)len && (n = write(p[1], A + off + w, len - (size_t)w)) > 0)
			w += n;
		while (r < w && (n = read(p[0], C + off + r, (size_t)(w - r))) > 0)
			r += n;
		expect("pipe I/O while pages are evicted", w + r, 2 * (long)len, A + off, C + off, len);
	}
	return NULL;
}

static void *blocked(void *arg)
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	while (!stop) {
		struct timespec t = {0, 200000};
		nanosleep(&t, NULL);
		for (size_t i = 0; i < N; i += 4096)
			if (A[i] != (char)(i * 31 + 1))
				die("a thread with every signal blocked read wrong data");
	}
	(void)arg;
	return NULL;
}

/* The test's go (a byte on stdin) ends the churn, after the eviction rounds
 * it wants: the threads run as long as the test evicts, however fast either
 * side is. */
static void *until_go(void *arg)
{
	struct pp *p = arg;
	wait_go();
	pthread_mutex_lock(&p->mu);
	p->left = 0;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void churn(void)
{
	struct pp *p = malloc(sizeof *p);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->turn = 0;
	p->left = 1;
	p->rounds = 0;
	pthread_t tp, tio, tb, tg;
	pthread_create(&tp, NULL, pong, p);
	pthread_create(&tio, NULL, pipes, NULL);
	pthread_create(&tb, NULL, blocked, NULL);
	pthread_create(&tg, NULL, until_go, p);
	pthread_mutex_lock(&p->mu);
	while (p->left > 0) {
		while (p->turn != 0 && p->left > 0)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->left <= 0)
			break;
		p->turn = 1;
		pthread_cond_signal(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	pthread_join(tp, NULL);
	pthread_join(tg, NULL);
	stop = 1;
	pthread_join(tio, NULL);
	pthread_join(tb, NULL);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: ringcalls calls|churn");
	A = malloc(N);
	C = malloc(N);
	if (!A || !C)
		die("malloc");
	pattern(A, N, 1);
	memset(C, 0x5a, N);
	if (!strcmp(argv[1], "churn")) {
		say("ready\n");
		churn();
		say("ok\n");
		return 0;
	}
	spawn_prepare();
	g_cmd = malloc(200);
	strcpy(g_cmd, "exit 7");
	strcpy(g_cmd + 100, "echo popen ok");
	g_dir = opendir("/");
	say("ready\n");
	wait_go();
	io();
	phase("io");
	sockets();
	phase("sockets");
	stats();
	phase("stat");
	dir();
	dir2();
	phase("dir");
	waits();
	phase("wait");
	futex();
	phase("futex");
	spawn();
	sys();
	execls();
	phase("spawn");
	misc();
	phase("misc");
	altstack();
	phase("altstack");
	wp();
	say("wp ok\n");
	return 0;
}
