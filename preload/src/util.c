/* Configuration, messages and raw system calls: nothing here allocates.
 * The configuration is read once (rm_init_config) and written here only:
 * WELCOME's min-alloc is offered (rm_offer_min_alloc), not stored by the
 * handshake. */
#include "rmem.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

size_t rm_page = 4096;
int rm_in_thread;
static size_t g_min_alloc = DEFAULT_MIN_ALLOC; /* atomic: WELCOME may change it */
static int g_min_from_env;
static uint64_t g_local_mem; /* RMEM_LOCAL_MEM; 0: the agent's budget */
static uint32_t g_max_slowdown; /* RMEM_MAX_SLOWDOWN, millionths; 0: the agent's */
static char g_sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static rm_fork_fn *real_fork;
static rm_sbrk_fn *real_sbrk;

size_t rm_min_alloc(void) { return __atomic_load_n(&g_min_alloc, __ATOMIC_RELAXED); }

/* The agent's min-alloc (WELCOME): taken unless RMEM_MIN_ALLOC set one. */
void rm_offer_min_alloc(uint64_t v)
{
	if (!g_min_from_env && v > 0)
		__atomic_store_n(&g_min_alloc, (size_t)v, __ATOMIC_RELAXED);
}

uint64_t rm_local_mem(void) { return g_local_mem; }
uint32_t rm_max_slowdown(void) { return g_max_slowdown; }
const char *rm_sock_path(void) { return g_sock_path; }
rm_fork_fn *rm_real_fork(void) { return real_fork; }
rm_sbrk_fn *rm_real_sbrk(void) { return real_sbrk; }

/* One line on stderr, the pieces concatenated (NULL ends them). */
void rm_say(const char *first, ...)
{
	char buf[512];
	size_t n = 0;
	va_list ap;
	va_start(ap, first);
	for (const char *s = first; s; s = va_arg(ap, const char *))
		for (; *s && n < sizeof buf - 1; s++)
			buf[n++] = *s;
	va_end(ap);
	buf[n++] = '\n';
	rm_sys(SYS_write, 2, buf, n);
}

/* strerror without its allocation: glibc's strerror may translate the
 * message through gettext, which allocates (and so may re-enter an
 * allocator whose mmap we are serving). */
const char *rm_errstr(int err)
{
	const char *s = strerrordesc_np(err);
	return s ? s : "unknown error";
}

long rm_sysret(long r)
{
	if ((unsigned long)r > -4096ul) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

void *rm_raw_mmap(void *a, size_t len, int prot, int flags, int fd, off_t off)
{
	return (void *)rm_sysret(rm_sys6(SYS_mmap, (long)a, (long)len, prot, flags, fd, off));
}

int rm_raw_munmap(void *a, size_t len) { return (int)rm_sysret(rm_sys(SYS_munmap, a, len, 0)); }
int rm_raw_madvise(void *a, size_t len, int advice) { return (int)rm_sysret(rm_sys(SYS_madvise, a, len, advice)); }
int rm_raw_mprotect(void *a, size_t len, int prot) { return (int)rm_sysret(rm_sys(SYS_mprotect, a, len, prot)); }

/* glibc's name (dlsym RTLD_NEXT, which allocates nothing when it finds
 * it): the function behind one the shim interposes. */
void *rm_libc(const char *name) { return dlsym(RTLD_NEXT, name); }

/* The shim's locks go to glibc's functions, resolved at first use: never
 * through the names kwait.c interposes for the program. */
static int (*p_lock)(pthread_mutex_t *);
static int (*p_cond_wait)(pthread_cond_t *, pthread_mutex_t *);
static int (*p_sem_wait)(sem_t *);

#define LIBC_FN(p, name)                                                         \
	({                                                                       \
		__typeof__(p) f_ = __atomic_load_n(&(p), __ATOMIC_ACQUIRE);     \
		if (!f_) {                                                       \
			f_ = (__typeof__(p))rm_libc(name);                       \
			__atomic_store_n(&(p), f_, __ATOMIC_RELEASE);            \
		}                                                                \
		f_;                                                              \
	})

int rm_lock(pthread_mutex_t *m) { return LIBC_FN(p_lock, "pthread_mutex_lock")(m); }
int rm_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) { return LIBC_FN(p_cond_wait, "pthread_cond_wait")(c, m); }
int rm_sem_wait(sem_t *s) { return LIBC_FN(p_sem_wait, "sem_wait")(s); }

/* All of them at once, by the process's first call into the shim: a
 * first use later, in the helper thread, would take the dynamic linker's
 * lock, which a dlopen of another thread holds while it waits for that
 * helper (its constructor's allocation: a request). */
static void libc_init(void)
{
	(void)LIBC_FN(p_lock, "pthread_mutex_lock");
	(void)LIBC_FN(p_cond_wait, "pthread_cond_wait");
	(void)LIBC_FN(p_sem_wait, "sem_wait");
}

size_t rm_parse_size(const char *s, int *ok)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	*ok = 0;
	if (errno || end == s)
		return 0;
	unsigned long long mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1ull << 10; end++; break;
	case 'm': case 'M': mul = 1ull << 20; end++; break;
	case 'g': case 'G': mul = 1ull << 30; end++; break;
	}
	if (mul > 1 && (*end == 'i' || *end == 'I'))
		end++;
	if (mul > 1 && (*end == 'b' || *end == 'B'))
		end++;
	if (*end || v > (~0ull) / mul)
		return 0;
	*ok = 1;
	return (size_t)(v * mul);
}

/* Reads the environment; idempotent. Called when the mode is decided, at
 * the process's first call into the shim (constructors of other
 * libraries may run before ours). getenv, strtoull and dlsym's success
 * path allocate nothing. */
void rm_init_config(void)
{
	static int done;
	if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
		return;
	long ps = sysconf(_SC_PAGESIZE);
	if (ps > 0)
		rm_page = (size_t)ps;
	const char *s = getenv(RMEM_ENV_MIN_ALLOC);
	if (s && *s) {
		int ok;
		size_t v = rm_parse_size(s, &ok);
		if (ok && v > 0) {
			g_min_alloc = v;
			g_min_from_env = 1;
		} else {
			rm_say("rmem: ignoring " RMEM_ENV_MIN_ALLOC "=", s,
			    " (want bytes, optionally with K, M, G, KiB, MiB or GiB)", NULL);
		}
	}
	const char *lm = getenv(RMEM_ENV_LOCAL_MEM);
	if (lm && *lm) {
		int ok;
		size_t v = rm_parse_size(lm, &ok);
		if (ok && v > 0)
			g_local_mem = v;
		else
			rm_say("rmem: ignoring " RMEM_ENV_LOCAL_MEM "=", lm,
			    " (want bytes, optionally with K, M, G, KiB, MiB or GiB)", NULL);
	}
	const char *ms = getenv(RMEM_ENV_MAX_SLOWDOWN);
	if (ms && *ms) {
		int ok;
		size_t v = rm_parse_size(ms, &ok);
		if (ok && v > 0 && v < 1000000)
			g_max_slowdown = (uint32_t)v;
		else
			rm_say("rmem: ignoring " RMEM_ENV_MAX_SLOWDOWN "=", ms,
			    " (want millionths of wall time, 1..999999)", NULL);
	}
	const char *it = getenv(RMEM_ENV_IN_THREAD);
	rm_in_thread = it && strcmp(it, "1") == 0;
	const char *p = getenv(RMEM_ENV_SOCKET);
	if (!p || !*p)
		p = RMEM_DEFAULT_SOCKET;
	strncpy(g_sock_path, p, sizeof g_sock_path - 1);
	libc_init();
	real_fork = (rm_fork_fn *)dlsym(RTLD_NEXT, "fork");
	real_sbrk = (rm_sbrk_fn *)dlsym(RTLD_NEXT, "sbrk");
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}
