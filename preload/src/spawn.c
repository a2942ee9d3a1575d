/* New programs: posix_spawn, system, popen and the exec family. Each
 * first tells the agent which descriptors go to the new program (HANDOFF,
 * handoff.c): a shared memory segment they reach is brought back into its
 * file before a program that may have no shim can map it; the call fails
 * with EPERM if the agent refuses (its pages lost). The rest is for ring
 * mode.
 *
 * glibc's posix_spawn (which system and popen call inside glibc, and
 * CPython's subprocess too) runs its child on the parent's memory
 * (CLONE_VM|CLONE_VFORK) with every signal blocked, and resets its
 * handlers to the default: a page of the parent's that the child touches
 * while missing kills it (a synchronous SIGBUS blocked, or unhandled),
 * and one the kernel reads for it (execve's path, argv, envp) makes exec
 * fail with EFAULT. What the child reads is the call's: the path, the
 * argument and environment vectors and their strings, the file actions
 * (their paths), the attributes, and for posix_spawnp the PATH of the
 * environment. So the wrappers make all of it present before the call,
 * and pin everything for the call's length (pin.c's rm_pin_everything:
 * the pieces are many and short-lived; the helper evicts nothing until
 * the child has exec'd, a millisecond or so).
 *
 * exec itself: its strings are read by the kernel, and an EFAULT there
 * fails the exec before anything is done (retried). A child of vfork
 * shares our memory but not our threads: it must not pin (an exec that
 * succeeds would leave the pin in our memory for good), so it touches and
 * retries only. */
#include "rmem.h"

#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

typedef int spawn_fn(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
		     char *const[], char *const[]);
typedef int system_fn(const char *);
typedef FILE *popen_fn(const char *, const char *);
typedef int execve_fn(const char *, char *const[], char *const[]);
typedef int execvpe_fn(const char *, char *const[], char *const[]);
typedef int fexecve_fn(int, char *const[], char *const[]);

static spawn_fn *real_posix_spawn, *real_posix_spawnp;
static system_fn *real_system;
static popen_fn *real_popen;
static execve_fn *real_execve;
static execvpe_fn *real_execvpe;
static fexecve_fn *real_fexecve;

__attribute__((constructor)) static void spawn_init(void)
{
	(void)RM_RESOLVE(posix_spawn);
	(void)RM_RESOLVE(posix_spawnp);
	(void)RM_RESOLVE(system);
	(void)RM_RESOLVE(popen);
	(void)RM_RESOLVE(execve);
	(void)RM_RESOLVE(execvpe);
	(void)RM_RESOLVE(fexecve);
}

static inline int ring_call(void) { return rm_ring_mode && !rm_in_shim(); }

static void touch_str(const char *s)
{
	if (s)
		rm_touch(s, strlen(s) + 1, 0); /* (strlen read it: present; now it stays) */
}

static void touch_vec(char *const *v)
{
	if (!v)
		return;
	size_t n = 0;
	while (v[n])
		touch_str(v[n++]);
	rm_touch(v, (n + 1) * sizeof *v, 0);
}

/* glibc's posix_spawn_file_actions_t's actions (spawn_int.h, stable since
 * glibc 2.0; chdir since 2.29): the paths of open and chdir. */
struct spawn_action {
	int tag; /* 0 close, 1 dup2, 2 open, 3 chdir, 4 fchdir, 5 closefrom, 6 tcsetpgrp */
	union {
		struct {
			int fd;
			char *path;
			int oflag;
			mode_t mode;
		} open;
		struct {
			char *path;
		} chdir;
		struct {
			int fd;
			int newfd;
		} dup2;
	} a;
};

static void touch_actions(const posix_spawn_file_actions_t *fa)
{
	if (!fa)
		return;
	rm_touch(fa, sizeof *fa, 0);
	const struct spawn_action *acts = (const void *)fa->__actions;
	int n = fa->__used;
	if (!acts || n <= 0)
		return;
	rm_touch(acts, (size_t)n * sizeof *acts, 0);
	for (int i = 0; i < n; i++)
		if (acts[i].tag == 2)
			touch_str(acts[i].a.open.path);
		else if (acts[i].tag == 3)
			touch_str(acts[i].a.chdir.path);
}

/* Tells the agent of the descriptors posix_spawn's child keeps: ours that
 * are not close-on-exec, and those its file actions dup2 (which may be).
 * Returns 0 or -EPERM. */
static int spawn_handoff(const posix_spawn_file_actions_t *fa)
{
	int fds[RMEM_HANDOFF_MAX_FDS * 4];
	size_t n = 0;
	const struct spawn_action *acts = fa ? (const void *)fa->__actions : NULL;
	for (int i = 0; acts && i < fa->__used && n < sizeof fds / sizeof *fds; i++)
		if (acts[i].tag == 1)
			fds[n++] = acts[i].a.dup2.fd;
	return rm_handoff_exec(fds, n);
}

/* HANDOFF before an exec: -1 with errno EPERM if refused, else 0. */
static int handed_off(void)
{
	if (rm_handoff_exec(NULL, 0) == 0)
		return 0;
	errno = EPERM;
	return -1;
}

/* Everything pinned, and what a new program's child reads present. */
static void spawn_begin(struct rm_pin *p, const char *path, char *const argv[], char *const envp[])
{
	rm_pin_begin(p);
	rm_pin_everything(p);
	rm_pin_publish(p);
	touch_str(path);
	touch_vec(argv);
	touch_vec(envp);
	if (envp != environ)
		touch_vec(environ); /* (posix_spawnp's PATH, system's and popen's environment) */
}

static int spawn(spawn_fn *fn, pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		 const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	if (spawn_handoff(fa) != 0)
		return EPERM;
	if (!ring_call())
		return fn(pid, path, fa, attr, argv, envp);
	struct rm_pin p;
	spawn_begin(&p, path, argv, envp);
	touch_actions(fa);
	if (attr)
		rm_touch(attr, sizeof *attr, 0);
	if (pid)
		rm_touch(pid, sizeof *pid, 1);
	int r = fn(pid, path, fa, attr, argv, envp);
	rm_pin_end(&p);
	return r;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn(RM_RESOLVE(posix_spawn), pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn(RM_RESOLVE(posix_spawnp), pid, file, fa, attr, argv, envp);
}

/* Pins s (a string) if it lies in a region, and makes it present. */
static void pin_str(struct rm_pin *p, const char *s)
{
	uintptr_t end;
	int flags;
	if (s && rm_table_span((uintptr_t)s, &end, &flags) != 0) /* (in one, or unknown) */
		rm_pin_range(p, s, strlen(s) + 1);
}

/* system spawns /bin/sh -c cmd with the environment, and waits for it to
 * end: pinning everything that long would stop eviction for as long as
 * the command runs. Its child reads only cmd and the environment (glibc
 * builds argv on its stack): those are pinned, as ranges, the parts in
 * regions only (glibc's setenv keeps its strings in glibc's own heap in
 * ring mode: alloc.c), then made present. popen returns once its child
 * has exec'd; its file actions are built inside it, written just before
 * the spawn (present), and pinned with everything. */
EXPORT int system(const char *cmd)
{
	if (cmd && handed_off() != 0)
		return -1;
	if (!ring_call() || !cmd)
		return RM_RESOLVE(system)(cmd);
	struct rm_pin p;
	rm_pin_begin(&p);
	pin_str(&p, cmd);
	if (environ) {
		size_t n = 0;
		for (; environ[n]; n++)
			pin_str(&p, environ[n]);
		uintptr_t end;
		int flags;
		if (rm_table_span((uintptr_t)environ, &end, &flags) != 0)
			rm_pin_range(&p, environ, (n + 1) * sizeof *environ);
	}
	rm_pin_publish(&p);
	touch_str(cmd);
	touch_vec(environ);
	int r = RM_RESOLVE(system)(cmd);
	rm_pin_end(&p);
	return r;
}

EXPORT FILE *popen(const char *cmd, const char *mode)
{
	if (handed_off() != 0)
		return NULL;
	if (!ring_call())
		return RM_RESOLVE(popen)(cmd, mode);
	struct rm_pin p;
	spawn_begin(&p, cmd, NULL, environ);
	touch_str(mode);
	FILE *f = RM_RESOLVE(popen)(cmd, mode);
	rm_pin_end(&p);
	return f;
}

/* ---- exec ---- */

/* Whether this is a child of vfork (our memory, another process). */
static int vforked(void) { return (pid_t)rm_sys(SYS_getpid, 0, 0, 0) != rm_conn_pid(); }

/* Runs an exec: its strings present, pinned unless vforked; again after an
 * EFAULT (it failed before it did anything). Returns only on failure. */
#define EXEC(path, argv, envp, call)                                           \
	({                                                                     \
		struct rm_pin p_;                                              \
		int pinned_ = !vforked(), r_;                                  \
		if (pinned_) {                                                 \
			rm_pin_begin(&p_);                                     \
			rm_pin_everything(&p_);                                \
			rm_pin_publish(&p_);                                   \
		}                                                              \
		for (int try_ = 0;; try_++) {                                  \
			touch_str(path);                                       \
			touch_vec(argv);                                       \
			touch_vec(envp);                                       \
			r_ = (call);                                           \
			if (errno != EFAULT || try_ == 3)                      \
				break;                                         \
		}                                                              \
		if (pinned_)                                                   \
			rm_pin_end(&p_);                                       \
		r_;                                                            \
	})

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	if (handed_off() != 0)
		return -1;
	if (!ring_call())
		return RM_RESOLVE(execve)(path, argv, envp);
	return EXEC(path, argv, envp, real_execve(path, argv, envp));
}

EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

/* execvp's search reads PATH from the environment. */
EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	if (handed_off() != 0)
		return -1;
	if (!ring_call())
		return RM_RESOLVE(execvpe)(file, argv, envp);
	if (envp != environ)
		touch_vec(environ);
	return EXEC(file, argv, envp, real_execvpe(file, argv, envp));
}

EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	if (handed_off() != 0)
		return -1;
	if (!ring_call())
		return RM_RESOLVE(fexecve)(fd, argv, envp);
	return EXEC((const char *)NULL, argv, envp, real_fexecve(fd, argv, envp));
}

/* execl, execlp, execle, as glibc writes them: the arguments counted, then
 * copied into a vector on our stack. No limit of ours: a list too long for
 * the kernel fails there, with E2BIG, as it would without rmem. */

/* largs_count returns how many arguments follow arg0 up to the terminating
 * NULL, plus one (ap: a copy, started after arg0). */
static size_t largs_count(va_list ap)
{
	size_t n = 1;
	while (va_arg(ap, char *))
		n++;
	return n;
}

/* largs_fill fills argv[0..n] (n from largs_count) and leaves *ap after the
 * terminating NULL (where execle's envp is). */
static void largs_fill(char **argv, const char *arg0, size_t n, va_list *ap)
{
	argv[0] = (char *)arg0;
	for (size_t i = 1; i <= n; i++)
		argv[i] = va_arg(*ap, char *);
}

EXPORT int execl(const char *path, const char *arg0, ...)
{
	va_list ap;
	va_start(ap, arg0);
	size_t n = largs_count(ap);
	va_end(ap);
	char *argv[n + 1];
	va_start(ap, arg0);
	largs_fill(argv, arg0, n, &ap);
	va_end(ap);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg0, ...)
{
	va_list ap;
	va_start(ap, arg0);
	size_t n = largs_count(ap);
	va_end(ap);
	char *argv[n + 1];
	va_start(ap, arg0);
	largs_fill(argv, arg0, n, &ap);
	va_end(ap);
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg0, ...)
{
	va_list ap;
	va_start(ap, arg0);
	size_t n = largs_count(ap);
	va_end(ap);
	char *argv[n + 1];
	va_start(ap, arg0);
	largs_fill(argv, arg0, n, &ap);
	char *const *envp = va_arg(ap, char *const *);
	va_end(ap);
	return execve(path, argv, envp);
}
