/* No EFAULT a program did not have before (ring mode), the long tail:
 * calls that read a path (a string the program keeps on its heap, as
 * CPython does) or fill a small struct or array, and glibc's functions
 * that open a path inside glibc (fopen, opendir); stdio's fread and fwrite,
 * which pass a big request's buffer to the kernel from inside glibc.
 *
 * Each pins and makes present what the kernel reads (the path) or writes
 * (the struct), as kcall.c does, and calls glibc's. Retried after an
 * EFAULT: those that have done nothing then (a path is read first;
 * getcwd, readlink, getrandom, uname, the rlimits, getrusage, sysinfo,
 * getsockname, getpeername, getsockopt, sched_getaffinity, statfs; pipe,
 * pipe2 and socketpair, whose new descriptors the kernel closes when it
 * cannot write them out). Not retried: accept and accept4 (the connection
 * is dropped when its address cannot be written) and the waits (the child
 * is reaped before its status is written): there the pin is the whole
 * answer. Still not seen: ioctl and fcntl arguments, and any other call
 * not wrapped here or in kcall.c, kwait.c. */
#include "rmem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>
#include <sys/times.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

int __open_2(const char *, int);
int __open64_2(const char *, int);
int __openat_2(int, const char *, int);
int __openat64_2(int, const char *, int);

static void add_path(struct rm_bufs *bs, const char *p)
{
	if (p) /* (strlen read it from user mode: present now) */
		rm_add(bs, p, strlen(p) + 1, 0);
}

/* A wrapped call: in ring mode, the buffers the statements after retry add
 * to bs are made present and pinned around it (RM_PINNED; retry: again
 * after an EFAULT); otherwise libc's own runs. */
#define PINNED_CALL(ret, name, params, args, retry, ...)                       \
	static ret(*real_##name) params;                                       \
	EXPORT ret name params                                                 \
	{                                                                      \
		if (!rm_ring_call())                                           \
			return RM_RESOLVE(name) args;                             \
		struct rm_bufs bs = {0};                                       \
		__VA_ARGS__;                                                   \
		return RM_PINNED(&bs, retry, real_##name args);                \
	}

/* A call of one path (and an output of outlen bytes at out, or none). */
#define PATH_CALL(ret, name, params, args, path, out, outlen, retry)          \
	PINNED_CALL(ret, name, params, args, retry, add_path(&bs, path); rm_add(&bs, out, outlen, 1))

/* A call of two paths. */
#define PATH2_CALL(ret, name, params, args, p1, p2)                            \
	PINNED_CALL(ret, name, params, args, 1, add_path(&bs, p1); add_path(&bs, p2))

/* A call that fills out (outlen bytes), and may read in (inlen). */
#define OUT_CALL(ret, name, params, args, out, outlen, in, inlen, retry)       \
	PINNED_CALL(ret, name, params, args, retry, rm_add(&bs, out, outlen, 1); rm_add(&bs, in, inlen, 0))

/* ---- paths ---- */

/* open's mode is there only with O_CREAT or O_TMPFILE. */
#define OPEN_MODE(flags)                                                       \
	mode_t mode = 0;                                                       \
	if ((flags) & (O_CREAT | __O_TMPFILE)) {                               \
		va_list ap;                                                    \
		va_start(ap, flags);                                           \
		mode = va_arg(ap, mode_t);                                     \
		va_end(ap);                                                    \
	}

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);

EXPORT int open(const char *path, int flags, ...)
{
	OPEN_MODE(flags);
	if (!rm_ring_call())
		return RM_RESOLVE(open)(path, flags, mode);
	struct rm_bufs bs = {0};
	add_path(&bs, path);
	return RM_PINNED(&bs, 1, real_open(path, flags, mode));
}
EXPORT int open64(const char *, int, ...) __attribute__((alias("open")));

EXPORT int openat(int dfd, const char *path, int flags, ...)
{
	OPEN_MODE(flags);
	if (!rm_ring_call())
		return RM_RESOLVE(openat)(dfd, path, flags, mode);
	struct rm_bufs bs = {0};
	add_path(&bs, path);
	return RM_PINNED(&bs, 1, real_openat(dfd, path, flags, mode));
}
EXPORT int openat64(int, const char *, int, ...) __attribute__((alias("openat")));

PATH_CALL(int, __open_2, (const char *p, int fl), (p, fl), p, NULL, 0, 1)
PATH_CALL(int, __open64_2, (const char *p, int fl), (p, fl), p, NULL, 0, 1)
PATH_CALL(int, __openat_2, (int d, const char *p, int fl), (d, p, fl), p, NULL, 0, 1)
PATH_CALL(int, __openat64_2, (int d, const char *p, int fl), (d, p, fl), p, NULL, 0, 1)
PATH_CALL(int, creat, (const char *p, mode_t m), (p, m), p, NULL, 0, 1)
PATH_CALL(int, access, (const char *p, int m), (p, m), p, NULL, 0, 1)
PATH_CALL(int, faccessat, (int d, const char *p, int m, int fl), (d, p, m, fl), p, NULL, 0, 1)
PATH_CALL(int, unlink, (const char *p), (p), p, NULL, 0, 1)
PATH_CALL(int, unlinkat, (int d, const char *p, int fl), (d, p, fl), p, NULL, 0, 1)
PATH_CALL(int, mkdir, (const char *p, mode_t m), (p, m), p, NULL, 0, 1)
PATH_CALL(int, mkdirat, (int d, const char *p, mode_t m), (d, p, m), p, NULL, 0, 1)
PATH_CALL(int, rmdir, (const char *p), (p), p, NULL, 0, 1)
PATH_CALL(int, chdir, (const char *p), (p), p, NULL, 0, 1)
PATH_CALL(int, chmod, (const char *p, mode_t m), (p, m), p, NULL, 0, 1)
PATH_CALL(int, chown, (const char *p, uid_t u, gid_t g), (p, u, g), p, NULL, 0, 1)
PATH_CALL(int, lchown, (const char *p, uid_t u, gid_t g), (p, u, g), p, NULL, 0, 1)
PATH_CALL(int, truncate, (const char *p, off_t l), (p, l), p, NULL, 0, 1)
PATH_CALL(int, statfs, (const char *p, struct statfs *b), (p, b), p, b, sizeof *b, 1)
PATH_CALL(ssize_t, readlink, (const char *p, char *b, size_t n), (p, b, n), p, b, n, 1)
PATH_CALL(ssize_t, readlinkat, (int d, const char *p, char *b, size_t n), (d, p, b, n), p, b, n, 1)
PATH2_CALL(int, rename, (const char *a, const char *b), (a, b), a, b)
PATH2_CALL(int, renameat, (int d, const char *a, int e, const char *b), (d, a, e, b), a, b)
PATH2_CALL(int, link, (const char *a, const char *b), (a, b), a, b)
PATH2_CALL(int, symlink, (const char *a, const char *b), (a, b), a, b)

/* Opened inside glibc, the path read there. */
PATH_CALL(FILE *, fopen, (const char *p, const char *m), (p, m), p, NULL, 0, 0)
PATH_CALL(FILE *, fopen64, (const char *p, const char *m), (p, m), p, NULL, 0, 0)
PATH_CALL(FILE *, freopen, (const char *p, const char *m, FILE *f), (p, m, f), p, NULL, 0, 0)
PATH_CALL(DIR *, opendir, (const char *p), (p), p, NULL, 0, 0)

/* stdio reads a big request straight into the program's buffer, and
 * writes a big one straight from it, with glibc's own read and write,
 * which no wrapper sees: the buffer is pinned and made present for the
 * call (no retry: a short count is what a stream returns then). A request
 * of more than RM_CALL_CHUNK bytes goes a chunk of whole elements at a
 * time (each pinned alone: kcall.c's io), up to a short count. call is
 * glibc's function on b_ and k_ elements. */
size_t __fread_chk(void *, size_t, size_t, size_t, FILE *);
#undef fread_unlocked  /* (macros of glibc's bits/stdio.h) */
#undef fwrite_unlocked

#define STDIO_CALL(name, params, args, buf, size, n, write, call)              \
	static size_t(*real_##name) params;                                    \
	EXPORT size_t name params                                              \
	{                                                                      \
		if (!rm_ring_call())                                           \
			return RM_RESOLVE(name) args;                             \
		size_t per_ = (size) && (size) <= RM_CALL_CHUNK ? RM_CALL_CHUNK / (size) : 1; \
		size_t got_ = 0;                                               \
		while (got_ < (n)) {                                           \
			size_t k_ = (n) - got_ < per_ ? (n) - got_ : per_;     \
			char *b_ = (char *)(buf) + got_ * (size);              \
			struct rm_bufs bs = {0};                               \
			rm_add(&bs, b_, k_ * (size), write);                   \
			struct rm_pin pin_;                                    \
			rm_bufs_pin(&pin_, &bs);                               \
			size_t r_ = (call);                                    \
			rm_pin_end(&pin_);                                     \
			got_ += r_;                                            \
			if (r_ < k_)                                           \
				break;                                         \
		}                                                              \
		return got_;                                                   \
	}

STDIO_CALL(fread, (void *b, size_t s, size_t n, FILE *f), (b, s, n, f), b, s, n, 1, real_fread(b_, s, k_, f))
STDIO_CALL(fread_unlocked, (void *b, size_t s, size_t n, FILE *f), (b, s, n, f), b, s, n, 1,
	   real_fread_unlocked(b_, s, k_, f))
STDIO_CALL(fwrite, (const void *b, size_t s, size_t n, FILE *f), (b, s, n, f), b, s, n, 0, real_fwrite(b_, s, k_, f))
STDIO_CALL(fwrite_unlocked, (const void *b, size_t s, size_t n, FILE *f), (b, s, n, f), b, s, n, 0,
	   real_fwrite_unlocked(b_, s, k_, f))
STDIO_CALL(__fread_chk, (void *b, size_t bl, size_t s, size_t n, FILE *f), (b, bl, s, n, f), b, s, n, 1,
	   real___fread_chk(b_, bl < (size_t)(b_ - (char *)b) ? 0 : bl - (size_t)(b_ - (char *)b), s, k_, f))

/* ---- small outputs ---- */

OUT_CALL(char *, getcwd, (char *b, size_t n), (b, n), b, n, NULL, 0, 0)
OUT_CALL(ssize_t, getrandom, (void *b, size_t n, unsigned fl), (b, n, fl), b, n, NULL, 0, 1)
OUT_CALL(int, pipe, (int fds[2]), (fds), fds, 2 * sizeof(int), NULL, 0, 1)
OUT_CALL(int, pipe2, (int fds[2], int fl), (fds, fl), fds, 2 * sizeof(int), NULL, 0, 1)
OUT_CALL(int, socketpair, (int d, int t, int p, int sv[2]), (d, t, p, sv), sv, 2 * sizeof(int), NULL, 0, 1)
OUT_CALL(int, uname, (struct utsname *u), (u), u, sizeof *u, NULL, 0, 1)
OUT_CALL(int, getrlimit, (__rlimit_resource_t r, struct rlimit *l), (r, l), l, sizeof *l, NULL, 0, 1)
OUT_CALL(int, setrlimit, (__rlimit_resource_t r, const struct rlimit *l), (r, l), NULL, 0, l, sizeof *l, 1)
OUT_CALL(int, getrusage, (__rusage_who_t w, struct rusage *u), (w, u), u, sizeof *u, NULL, 0, 1)
OUT_CALL(int, sysinfo, (struct sysinfo *i), (i), i, sizeof *i, NULL, 0, 1)
OUT_CALL(clock_t, times, (struct tms *t), (t), t, sizeof *t, NULL, 0, 0)
OUT_CALL(int, fstatfs, (int fd, struct statfs *b), (fd, b), b, sizeof *b, NULL, 0, 1)
OUT_CALL(int, sched_getaffinity, (pid_t p, size_t n, cpu_set_t *m), (p, n, m), m, n, NULL, 0, 1)
OUT_CALL(int, sched_setaffinity, (pid_t p, size_t n, const cpu_set_t *m), (p, n, m), NULL, 0, m, n, 1)
OUT_CALL(int, getgroups, (int n, gid_t *l), (n, l), l, n > 0 ? (size_t)n * sizeof *l : 0, NULL, 0, 1)
OUT_CALL(pid_t, wait, (int *st), (st), st, sizeof *st, NULL, 0, 0)
OUT_CALL(pid_t, waitpid, (pid_t p, int *st, int o), (p, st, o), st, sizeof *st, NULL, 0, 0)
OUT_CALL(int, waitid, (idtype_t t, id_t id, siginfo_t *i, int o), (t, id, i, o), i, sizeof *i, NULL, 0, 0)

/* A socket address and its length: both written (the length read too). */
static void add_addr(struct rm_bufs *bs, void *addr, socklen_t *len)
{
	if (len) {
		rm_add(bs, len, sizeof *len, 1);
		if (addr)
			rm_add(bs, addr, *len, 1);
	}
}

#define ADDR_CALL(name, params, args, addr, len, retry)                        \
	static int(*real_##name) params;                                       \
	EXPORT int name params                                                 \
	{                                                                      \
		if (!rm_ring_call())                                           \
			return RM_RESOLVE(name) args;                             \
		struct rm_bufs bs = {0};                                       \
		add_addr(&bs, addr, len);                                      \
		return RM_PINNED(&bs, retry, real_##name args);                \
	}

ADDR_CALL(accept, (int fd, struct sockaddr *a, socklen_t *l), (fd, a, l), a, l, 0)
ADDR_CALL(accept4, (int fd, struct sockaddr *a, socklen_t *l, int fl), (fd, a, l, fl), a, l, 0)
ADDR_CALL(getsockname, (int fd, struct sockaddr *a, socklen_t *l), (fd, a, l), a, l, 1)
ADDR_CALL(getpeername, (int fd, struct sockaddr *a, socklen_t *l), (fd, a, l), a, l, 1)
ADDR_CALL(getsockopt, (int fd, int lv, int o, void *v, socklen_t *l), (fd, lv, o, v, l), v, l, 1)

static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
EXPORT int setsockopt(int fd, int lv, int o, const void *v, socklen_t l)
{
	if (!rm_ring_call())
		return RM_RESOLVE(setsockopt)(fd, lv, o, v, l);
	struct rm_bufs bs = {0};
	rm_add(&bs, v, l, 0);
	return RM_PINNED(&bs, 1, real_setsockopt(fd, lv, o, v, l));
}

static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_bind)(int, const struct sockaddr *, socklen_t);
EXPORT int connect(int fd, const struct sockaddr *a, socklen_t l)
{
	if (!rm_ring_call())
		return RM_RESOLVE(connect)(fd, a, l);
	struct rm_bufs bs = {0};
	rm_add(&bs, a, l, 0);
	return RM_PINNED(&bs, 1, real_connect(fd, a, l));
}
EXPORT int bind(int fd, const struct sockaddr *a, socklen_t l)
{
	if (!rm_ring_call())
		return RM_RESOLVE(bind)(fd, a, l);
	struct rm_bufs bs = {0};
	rm_add(&bs, a, l, 0);
	return RM_PINNED(&bs, 1, real_bind(fd, a, l));
}

/* ---- resolved by the constructor (a call may come from a signal handler) ---- */

__attribute__((constructor)) static void kmisc_init(void)
{
	(void)RM_RESOLVE(open), (void)RM_RESOLVE(openat), (void)RM_RESOLVE(__open_2), (void)RM_RESOLVE(__open64_2);
	(void)RM_RESOLVE(__openat_2), (void)RM_RESOLVE(__openat64_2), (void)RM_RESOLVE(creat), (void)RM_RESOLVE(access);
	(void)RM_RESOLVE(faccessat), (void)RM_RESOLVE(unlink), (void)RM_RESOLVE(unlinkat), (void)RM_RESOLVE(mkdir);
	(void)RM_RESOLVE(mkdirat), (void)RM_RESOLVE(rmdir), (void)RM_RESOLVE(chdir), (void)RM_RESOLVE(chmod);
	(void)RM_RESOLVE(chown), (void)RM_RESOLVE(lchown), (void)RM_RESOLVE(truncate), (void)RM_RESOLVE(statfs);
	(void)RM_RESOLVE(readlink), (void)RM_RESOLVE(readlinkat), (void)RM_RESOLVE(rename), (void)RM_RESOLVE(renameat);
	(void)RM_RESOLVE(link), (void)RM_RESOLVE(symlink), (void)RM_RESOLVE(fopen), (void)RM_RESOLVE(fopen64);
	(void)RM_RESOLVE(freopen), (void)RM_RESOLVE(opendir), (void)RM_RESOLVE(getcwd), (void)RM_RESOLVE(getrandom);
	(void)RM_RESOLVE(pipe), (void)RM_RESOLVE(pipe2), (void)RM_RESOLVE(socketpair), (void)RM_RESOLVE(uname);
	(void)RM_RESOLVE(getrlimit), (void)RM_RESOLVE(setrlimit), (void)RM_RESOLVE(getrusage), (void)RM_RESOLVE(sysinfo);
	(void)RM_RESOLVE(times), (void)RM_RESOLVE(fstatfs), (void)RM_RESOLVE(sched_getaffinity);
	(void)RM_RESOLVE(sched_setaffinity), (void)RM_RESOLVE(getgroups), (void)RM_RESOLVE(wait), (void)RM_RESOLVE(waitpid);
	(void)RM_RESOLVE(waitid), (void)RM_RESOLVE(accept), (void)RM_RESOLVE(accept4), (void)RM_RESOLVE(getsockname);
	(void)RM_RESOLVE(getpeername), (void)RM_RESOLVE(getsockopt), (void)RM_RESOLVE(setsockopt), (void)RM_RESOLVE(connect);
	(void)RM_RESOLVE(bind), (void)RM_RESOLVE(fread), (void)RM_RESOLVE(fread_unlocked), (void)RM_RESOLVE(fwrite);
	(void)RM_RESOLVE(fwrite_unlocked), (void)RM_RESOLVE(__fread_chk);
}
