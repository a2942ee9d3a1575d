/* librmem.so: the LD_PRELOAD shim of rmem (see doc.go and docs/pager.md).
 *
 * Large allocations (>= min-alloc) made through malloc & co. or anonymous
 * private mmap become their own page-aligned anonymous mappings,
 * registered (MISSING|WP) with the process's single userfaultfd and
 * announced to memagent with REGION_ADD; the agent serves their faults and
 * evicts their cold pages through the helper thread below. Everything else
 * goes to glibc (__libc_* and raw system calls).
 *
 * Locks, in this order: init_mu (connection state), req_mu (one request to
 * the agent at a time; also keeps the region table stable for fork),
 * table_mu (the region table), reply_mu (hand-over of replies from the
 * helper thread). The helper takes only table_mu (during an EVICT batch)
 * and reply_mu.
 *
 * Nothing here may allocate through the shim: shim code runs with the
 * per-thread guard in_shim set, and every allocation made while it is set
 * (by libc functions we call, dlsym, pthread_create) goes to glibc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include "../proto.h"

#define EXPORT __attribute__((visibility("default")))
#define TLS __attribute__((tls_model("initial-exec"))) __thread

/* Default threshold: 1 MiB, by measurement (BenchmarkShimAlloc in
 * preload/bench_test.go, 2-vCPU VM, Linux 6.18, against the test agent):
 *
 *   malloc+free          256 KiB    1 MiB     4 MiB     16 MiB
 *   glibc, untouched      0.1 us    0.1 us    0.1 us    0.1 us  (reuses its heap)
 *   shim, untouched        (glibc)  154 us    174 us    255 us  (mmap, register,
 *                                                               REGION_ADD/DEL round trips)
 *   glibc, every page     0.8 us    5.4 us    21 us     87 us   (pages already resident)
 *   shim, every page       (glibc)  15 ms     66 ms     268 ms  (~60 us per agent-served
 *                                                               fault with the test agent)
 *
 * A region costs ~150-250 us once, about what 3-8 agent-served faults
 * cost: from 1 MiB (256 pages) up that is at most ~1-4% of faulting the
 * block in, and the number of regions stays small (the agent tracks each).
 * Below that, blocks are many, short-lived and cheap to keep local, and
 * glibc recycles them without any fault; paging them would multiply the
 * per-allocation cost by ~1000 for little memory. RMEM_MIN_ALLOC or the
 * agent's --min-alloc (WELCOME) change it. */
#define DEFAULT_MIN_ALLOC (1u << 20)

/* Region table capacity: 16384 live regions of >= 1 MiB is 16 GiB and
 * more; past it allocations fall back to glibc (said once). */
#define MAX_REGIONS 16384

/* No UFFD_FEATURE_EVENT_REMOVE: a REMOVE event blocks the thread that
 * called madvise until the agent reads it, which made every run of an
 * eviction batch (the helper's MADV_DONTNEED) a round trip between two
 * threads, and made the agent's ioctls fail with EAGAIN meanwhile. The
 * program's own drops reach the agent as REGION_ZAP (see madvise below). */
#define UFFD_FEATURES                                                          \
	(UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |                  \
	 UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP |           \
	 UFFD_FEATURE_THREAD_ID)

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

enum state { ST_UNINIT, ST_CONNECTED, ST_OFF };
enum kind { KIND_HEAP = RMEM_KIND_HEAP, KIND_MMAP = RMEM_KIND_MMAP };

struct region {
	uintptr_t base; /* page aligned */
	size_t len;     /* page multiple */
	uintptr_t user; /* what malloc & co. returned (heap kind) */
	uint64_t id;
	int kind;
};

static TLS int in_shim;
static TLS int in_fork; /* inside real fork: atfork handlers of other libraries run */

static int g_state = ST_UNINIT; /* atomic loads; changed under init_mu */
static size_t g_page = 4096;
static size_t g_min_alloc = DEFAULT_MIN_ALLOC;
static int g_min_from_env;
static char g_sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static pid_t g_pid;      /* the process that made the connection */
static int g_uffd = -1; /* our own reference: a dead agent blocks, never zeros */
static int g_uffd_dev = -1; /* /dev/userfaultfd lent by the agent (UFFD_DEVICE), kept for forks */
static int g_sock = -1;
static char *g_staging;
static uint32_t g_slots;
static uint64_t g_features;
static uint64_t g_fork_serial; /* forks with regions: FORK events, or FORK_PREPAREs */
static uint32_t g_seq;
static uint64_t g_next_id = 1;
static int g_lost_said, g_full_said;

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t req_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t reply_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reply_cv = PTHREAD_COND_INITIALIZER;

/* The one outstanding request (under reply_mu). */
static struct {
	uint32_t seq;
	int done;
	int err; /* 0: ACK, else ERROR's errno or EPIPE */
	int dead; /* the connection is gone */
} g_reply;

static struct region g_regions[MAX_REGIONS]; /* sorted by base; table_mu */
static int g_nregions;                        /* atomic loads */

/* The helper thread. Creating a thread allocates (glibc callocs its TLS
 * vector through the malloc in front): safe from our own malloc, not from
 * inside another allocator's mmap call (jemalloc holds its locks there, and
 * deadlocks). So when another malloc is in front of ours the helper is
 * created by the constructor, and waits on g_conn_sem for a connection. */
static sem_t g_conn_sem;
static int g_helper_exists;
static int g_foreign_malloc;
static int g_ctor_done; /* mmaps before our constructor stay ordinary */

static size_t (*real_usable_size)(void *);
static pid_t (*real_fork)(void);

/* ---- small helpers that allocate nothing ---- */

static void say(const char *first, ...)
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
	ssize_t w = write(2, buf, n);
	(void)w;
}

static void *raw_mmap(void *a, size_t len, int prot, int flags, int fd, off_t off)
{
	return (void *)syscall(SYS_mmap, a, len, prot, flags, fd, off);
}

static int raw_munmap(void *a, size_t len) { return (int)syscall(SYS_munmap, a, len); }
static int raw_madvise(void *a, size_t len, int advice) { return (int)syscall(SYS_madvise, a, len, advice); }

static size_t round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

static int add_overflows(size_t a, size_t b) { return a + b < a; }

static int large(size_t n) { return n >= g_min_alloc; }

static uint64_t g_local_mem; /* RMEM_LOCAL_MEM; 0: the agent's budget */

static size_t parse_size(const char *s, int *ok)
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

/* Reads the environment; idempotent, called from the constructor and from
 * the first large allocation (constructors of other libraries may run
 * before ours). */
static void init_config(void)
{
	static int done;
	if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
		return;
	long ps = sysconf(_SC_PAGESIZE);
	if (ps > 0)
		g_page = (size_t)ps;
	const char *s = getenv(RMEM_ENV_MIN_ALLOC);
	if (s && *s) {
		int ok;
		size_t v = parse_size(s, &ok);
		if (ok && v > 0) {
			g_min_alloc = v;
			g_min_from_env = 1;
		} else {
			say("rmem: ignoring " RMEM_ENV_MIN_ALLOC "=", s,
			    " (want bytes, optionally with K, M, G, KiB, MiB or GiB)", NULL);
		}
	}
	const char *lm = getenv(RMEM_ENV_LOCAL_MEM);
	if (lm && *lm) {
		int ok;
		size_t v = parse_size(lm, &ok);
		if (ok && v > 0)
			g_local_mem = v;
		else
			say("rmem: ignoring " RMEM_ENV_LOCAL_MEM "=", lm,
			    " (want bytes, optionally with K, M, G, KiB, MiB or GiB)", NULL);
	}
	const char *p = getenv(RMEM_ENV_SOCKET);
	if (!p || !*p)
		p = RMEM_DEFAULT_SOCKET;
	strncpy(g_sock_path, p, sizeof g_sock_path - 1);
	if (!real_usable_size)
		real_usable_size = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
	if (!real_fork)
		real_fork = (pid_t(*)(void))dlsym(RTLD_NEXT, "fork");
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

static int start_helper(void);
static void atfork_prepare(void);
static void atfork_parent(void);
static void atfork_child(void);

/* Whether the malloc the program uses is another library's (a preloaded
 * jemalloc in front of us, or one linked statically into the program). */
static int foreign_malloc(void)
{
	Dl_info mine, theirs;
	void *m = dlsym(RTLD_DEFAULT, "malloc");
	if (!m || !dladdr((void *)foreign_malloc, &mine) || !dladdr(m, &theirs))
		return 1; /* unsure: take the careful path */
	return mine.dli_fbase != theirs.dli_fbase;
}

__attribute__((constructor)) static void rmem_init(void)
{
	in_shim++;
	init_config();
	sem_init(&g_conn_sem, 0, 0);
	g_foreign_malloc = foreign_malloc();
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	if (g_foreign_malloc && start_helper() != 0)
		say("rmem: cannot start the helper thread: using ordinary memory", NULL);
	__atomic_store_n(&g_ctor_done, 1, __ATOMIC_RELEASE);
	in_shim--;
}

/* ---- the region table (table_mu) ---- */

/* Index of the last region with base <= a, or -1. */
static int table_floor_locked(uintptr_t a)
{
	int lo = 0, hi = g_nregions; /* answer in [lo-1, hi) */
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (g_regions[mid].base <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo - 1;
}

static int table_find_locked(uintptr_t a)
{
	int i = table_floor_locked(a);
	if (i >= 0 && a - g_regions[i].base < g_regions[i].len)
		return i;
	return -1;
}

/* Whether [a, a+len) lies inside one region. */
static int table_covers_locked(uintptr_t a, size_t len)
{
	int i = table_find_locked(a);
	return i >= 0 && a + len - g_regions[i].base <= g_regions[i].len;
}

static int table_insert_locked(const struct region *r)
{
	if (g_nregions == MAX_REGIONS)
		return -1;
	int i = table_floor_locked(r->base) + 1;
	memmove(&g_regions[i + 1], &g_regions[i], (size_t)(g_nregions - i) * sizeof *r);
	g_regions[i] = *r;
	__atomic_store_n(&g_nregions, g_nregions + 1, __ATOMIC_RELEASE);
	return 0;
}

static void table_remove_locked(int i)
{
	memmove(&g_regions[i], &g_regions[i + 1], (size_t)(g_nregions - i - 1) * sizeof g_regions[0]);
	__atomic_store_n(&g_nregions, g_nregions - 1, __ATOMIC_RELEASE);
}

/* The heap region whose malloc pointer is p, copied to *out. */
static int lookup_heap(void *p, struct region *out)
{
	uintptr_t a = (uintptr_t)p;
	if (!p || (a & (g_page - 1)) || !__atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE))
		return 0;
	int found = 0;
	pthread_mutex_lock(&table_mu);
	int i = table_find_locked(a);
	if (i >= 0 && g_regions[i].kind == KIND_HEAP && g_regions[i].user == a) {
		*out = g_regions[i];
		found = 1;
	}
	pthread_mutex_unlock(&table_mu);
	return found;
}

/* ---- talking to the agent ---- */

static void set_off(void) { __atomic_store_n(&g_state, ST_OFF, __ATOMIC_RELEASE); }

/* Whether this process may talk to the agent. A child made past fork(3)
 * and its atfork handlers (_Fork(), a raw clone) inherited its parent's
 * connection and uffd: using them would register memory in the parent's
 * address space and speak for the parent, so such a child drops them and
 * uses ordinary memory from then on. It did not inherit the regions
 * (MADV_DONTFORK, see "fork"): their addresses are reserved inaccessible,
 * so that touching a pooled allocation raises SIGSEGV and no other mapping
 * lands where the table still names a region (free() of one unmaps it). */
static void child_lost_pages(const char *why, int err);

static int is_connected(void)
{
	if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != ST_CONNECTED || in_fork)
		return 0; /* in fork: the child's connection is not made yet */
	if (getpid() == g_pid)
		return 1;
	int connected = ST_CONNECTED; /* no lock: callers may hold req_mu */
	if (__atomic_compare_exchange_n(&g_state, &connected, ST_OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		close(g_sock);
		close(g_uffd);
		g_sock = g_uffd = -1;
		int n = __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE);
		for (int i = 0; i < n; i++) /* the only thread: fork leaves one */
			raw_mmap((void *)g_regions[i].base, g_regions[i].len, PROT_NONE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
		say("rmem: this process was forked without fork(3) (_Fork(), a raw clone): it did not inherit its"
		    " parent's large allocations (touching them raises SIGSEGV) and uses ordinary memory from now on",
		    NULL);
	}
	return 0;
}

/* req_mu, unless this thread is inside our fork() wrapper, which holds it
 * already (another library's atfork handler may free a region). */
static void req_lock(void)
{
	if (!in_fork)
		pthread_mutex_lock(&req_mu);
}

static void req_unlock(void)
{
	if (!in_fork)
		pthread_mutex_unlock(&req_mu);
}

/* While this thread is inside our fork() (other libraries' atfork
 * handlers run there), the region set is frozen, so that the FORK event
 * and the fork serial agree with what the child inherits: big allocations
 * go to glibc and unmapping regions waits here until fork returns (in the
 * parent, and in the child, which inherits both the region and the entry). */
#define MAX_DEFERRED 32
static struct {
	uintptr_t a;
	size_t len;
} g_deferred[MAX_DEFERRED];
static int g_ndeferred;

static int defer_unmap(uintptr_t a, size_t len)
{
	if (g_ndeferred == MAX_DEFERRED)
		return 0;
	g_deferred[g_ndeferred].a = a;
	g_deferred[g_ndeferred].len = len;
	g_ndeferred++;
	return 1;
}

static int punch_locked(uintptr_t a, size_t len);

/* Preconditions: req_mu held, not in fork. */
static void run_deferred_locked(void)
{
	for (int i = 0; i < g_ndeferred; i++) {
		punch_locked(g_deferred[i].a, g_deferred[i].len);
		raw_munmap((void *)g_deferred[i].a, g_deferred[i].len);
	}
	g_ndeferred = 0;
}

static int send_packet(uint16_t type, uint32_t seq, const void *body, uint32_t len, int fd)
{
	struct rmem_hdr h = {RMEM_MAGIC, RMEM_VERSION, type, seq, len};
	struct iovec iov[2] = {{&h, sizeof h}, {(void *)body, len}};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	ssize_t n;
	do
		n = sendmsg(g_sock, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == (ssize_t)(sizeof h + len) ? 0 : -EPROTO;
}

/* Receives one packet into buf (RMEM_MAX_PACKET bytes) and checks its
 * header; descriptors (at most RMEM_MAX_FDS) land in fds, *nfds says how
 * many. Returns the body length or -errno. */
static int recv_packet(int sock, void *buf, struct rmem_hdr *h, int *fds, int *nfds)
{
	union {
		char buf[CMSG_SPACE(RMEM_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {buf, RMEM_MAX_PACKET};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			   .msg_controllen = sizeof u.buf};
	ssize_t n;
	do
		n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	int got = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
			if (fds && got < RMEM_MAX_FDS)
				fds[got++] = fd;
			else
				close(fd);
		}
	}
	if (nfds)
		*nfds = got;
	else
		while (got > 0)
			close(fds[--got]);
	if (n == 0)
		return -ECONNRESET;
	if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n < (ssize_t)sizeof *h)
		return -EPROTO;
	memcpy(h, buf, sizeof *h);
	if (h->magic != RMEM_MAGIC || h->version != RMEM_VERSION || h->len != (size_t)n - sizeof *h)
		return -EPROTO;
	return (int)h->len;
}

/* The connection is gone: wake the requester, say so once. Memory the
 * agent paged out stays out: its faults wait (we hold the uffd). */
static void lost_agent(int err)
{
	pthread_mutex_lock(&reply_mu);
	g_reply.dead = 1;
	pthread_cond_broadcast(&reply_cv);
	pthread_mutex_unlock(&reply_mu);
	set_off();
	if (!__atomic_exchange_n(&g_lost_said, 1, __ATOMIC_ACQ_REL))
		say("rmem: lost the agent (", strerror(err),
		    "): new allocations use ordinary memory; paged-out memory waits for an agent", NULL);
}

/* Sends a request and waits for its ACK or ERROR. Returns 0 or -errno.
 * Preconditions: req_mu held, state connected. */
static int request_locked(uint16_t type, const void *body, uint32_t len)
{
	uint32_t seq = ++g_seq;
	pthread_mutex_lock(&reply_mu);
	if (g_reply.dead) {
		pthread_mutex_unlock(&reply_mu);
		return -EPIPE;
	}
	g_reply.seq = seq;
	g_reply.done = 0;
	pthread_mutex_unlock(&reply_mu);
	int err = send_packet(type, seq, body, len, -1);
	pthread_mutex_lock(&reply_mu);
	while (!err && !g_reply.done && !g_reply.dead)
		pthread_cond_wait(&reply_cv, &reply_mu);
	if (!err)
		err = g_reply.done ? -g_reply.err : -EPIPE;
	g_reply.seq = 0;
	pthread_mutex_unlock(&reply_mu);
	return err;
}

static void deliver_reply(uint32_t seq, int err)
{
	pthread_mutex_lock(&reply_mu);
	if (g_reply.seq == seq && !g_reply.done) {
		g_reply.err = err;
		g_reply.done = 1;
		pthread_cond_broadcast(&reply_cv);
	}
	pthread_mutex_unlock(&reply_mu);
}

/* Copies the victims into their staging slots and drops them. Runs on the
 * helper thread, under table_mu so that no region goes away meanwhile
 * (and an EVICT naming memory we do not have is refused, not followed). */
static void evict(const struct rmem_evict *ev, struct rmem_evicted *out)
{
	uint32_t done = 0;
	int err = 0;
	pthread_mutex_lock(&table_mu);
	for (; done < ev->n; done++) {
		uintptr_t a = (uintptr_t)ev->pages[done].addr;
		uint32_t s = ev->pages[done].slot;
		if ((a & (g_page - 1)) || (s >= g_slots && s != RMEM_NO_SLOT)) {
			err = EINVAL;
			break;
		}
		if (!table_covers_locked(a, g_page)) {
			err = EFAULT;
			break;
		}
		if (s != RMEM_NO_SLOT)
			memcpy(g_staging + (size_t)s * g_page, (void *)a, g_page);
	}
	/* Drop the pages, one madvise per run of neighbours (the agent sorts
	 * its victims). No REMOVE event: the shim does not ask for them. */
	uint32_t i = 0;
	while (i < done) {
		uintptr_t start = (uintptr_t)ev->pages[i].addr;
		uint32_t j = i + 1;
		while (j < done && (uintptr_t)ev->pages[j].addr == start + (j - i) * g_page)
			j++;
		if (raw_madvise((void *)start, (j - i) * g_page, MADV_DONTNEED) != 0) {
			err = errno;
			done = i;
			break;
		}
		i = j;
	}
	pthread_mutex_unlock(&table_mu);
	out->batch = ev->batch;
	out->done = done;
	out->err = done < ev->n ? (uint32_t)err : 0;
}

/* The helper thread: the only reader of the agent socket. It must not
 * allocate through the shim (in_shim stays set) and runs with every signal
 * blocked so that the program's handlers never run on it. */
static void serve(int sock)
{
	static union {
		char buf[RMEM_MAX_PACKET];
		uint64_t align;
	} pkt;
	for (;;) {
		struct rmem_hdr h;
		int n = recv_packet(sock, pkt.buf, &h, NULL, NULL);
		if (n < 0) {
			lost_agent(n == -EPROTO ? EPROTO : -n);
			return;
		}
		const char *body = pkt.buf + sizeof h;
		switch (h.type) {
		case RMEM_ACK:
			if (n != sizeof(struct rmem_ack))
				goto bad;
			deliver_reply(((const struct rmem_ack *)body)->seq, 0);
			break;
		case RMEM_ERROR: {
			if (n < 8)
				goto bad;
			struct rmem_error e;
			memcpy(&e, body, 8);
			deliver_reply(e.seq, e.err ? (int)e.err : EIO);
			break;
		}
		case RMEM_EVICT: {
			struct rmem_evict ev;
			if (n < 16)
				goto bad;
			memcpy(&ev, body, 16);
			if (ev.n == 0 || ev.n > RMEM_MAX_EVICT_BATCH || (size_t)n != 16 + ev.n * sizeof ev.pages[0])
				goto bad;
			memcpy(ev.pages, body + 16, ev.n * sizeof ev.pages[0]);
			struct rmem_evicted out;
			evict(&ev, &out);
			int err = send_packet(RMEM_EVICTED, 0, &out, sizeof out, -1);
			if (err) {
				lost_agent(-err);
				return;
			}
			break;
		}
		default:
			goto bad;
		}
		continue;
	bad:
		lost_agent(EPROTO);
		shutdown(sock, SHUT_RDWR);
		return;
	}
}

static void *helper_main(void *arg)
{
	(void)arg;
	in_shim = 1;
	for (;;) {
		while (sem_wait(&g_conn_sem) != 0)
			;
		serve(g_sock);
	}
	return NULL;
}

static int start_helper(void)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 << 10);
	pthread_t t;
	int err = pthread_create(&t, &attr, helper_main, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!err)
		g_helper_exists = 1;
	return err;
}

/* A new userfaultfd of this process: through /dev/userfaultfd, else the
 * system call (both need privileges or the administrator's leave: the
 * device's mode, vm.unprivileged_userfaultfd), else through the device the
 * agent lent us. UFFD_USER_MODE_ONLY, which any user may have, is not
 * used: the kernel's own accesses to our memory (read(2) into a buffer
 * whose pages are in the pool) would fail with EFAULT instead of faulting
 * them in. Returns the fd or -errno. */
static int new_uffd(void)
{
	int fd = -1, e = EPERM;
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
		close(dev);
	}
	if (fd < 0)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0 && g_uffd_dev >= 0)
		fd = ioctl(g_uffd_dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		e = errno;
	return fd >= 0 ? fd : -e;
}

/* The handshake's packet buffer (handshake runs under init_mu, or in a
 * fork child's only thread). */
static union {
	char buf[RMEM_MAX_PACKET];
	uint64_t align;
} g_hs_pkt;

/* A request of the handshake, before the helper thread serves the socket
 * s: sends it and receives the reply into g_hs_pkt, returning the reply's
 * body length or -errno. An ERROR reply is -its errno, with *why set to
 * refused followed by the agent's text. */
static int hs_request(int s, uint16_t type, const void *body, uint32_t len, int fd, const char *refused,
		      struct rmem_hdr *h, int *fds, int *nfds, const char **why)
{
	static char text[RMEM_MAX_ERROR_TEXT + 96];
	int err = send_packet(type, ++g_seq, body, len, fd);
	int n = err ? err : recv_packet(s, g_hs_pkt.buf, h, fds, nfds);
	if (n < 0 || h->type != RMEM_ERROR)
		return n;
	for (int i = 0; i < *nfds; i++)
		close(fds[i]);
	*nfds = 0;
	if (n < 8 || n > (int)sizeof(struct rmem_error)) {
		*why = "malformed ERROR from the agent";
		return -EPROTO;
	}
	struct rmem_error e;
	memcpy(&e, g_hs_pkt.buf + sizeof *h, (size_t)n);
	size_t pl = strlen(refused), tl = (size_t)n - 8;
	memcpy(text, refused, pl);
	memcpy(text + pl, e.text, tl);
	text[pl + tl] = 0;
	*why = text;
	return -(e.err ? (int)e.err : EPERM);
}

/* A new userfaultfd (new_uffd) with features negotiated. Returns the fd
 * or -errno. */
static int uffd_with(uint64_t features)
{
	int fd = new_uffd();
	struct uffdio_api api = {.api = UFFD_API, .features = features};
	if (fd >= 0 && ioctl(fd, UFFDIO_API, &api) != 0) {
		int e = errno;
		close(fd);
		fd = -e;
	}
	return fd;
}

/* Asks the agent for /dev/userfaultfd (UFFD_DEVICE) on the connected
 * socket s, before HELLO. Returns 0, or -errno with *why set. */
static int borrow_uffd_device(int s, const char **why)
{
	int fds[RMEM_MAX_FDS], nfds = 0;
	struct rmem_hdr h;
	*why = "the agent lent no /dev/userfaultfd";
	int n = hs_request(s, RMEM_UFFD_DEVICE, NULL, 0, -1,
			   "cannot create a userfaultfd, and the agent refused to lend one: ", &h, fds, &nfds, why);
	if (n >= 0 && (h.type != RMEM_ACK || nfds != 1))
		n = -EPROTO;
	if (n < 0) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return n;
	}
	g_uffd_dev = fds[0];
	return 0;
}

/* Makes this process's uffd with the features the shim needs: FORK events
 * if the kernel grants them (CAP_SYS_PTRACE), else without them (fork()
 * then goes through FORK_PREPARE and the child's own uffd). s: the agent's
 * socket, for UFFD_DEVICE. Returns the fd or -errno with *why set. */
static int open_uffd(int s, uint64_t *features, const char **why)
{
	uint64_t want = UFFD_FEATURES;
	int fd = uffd_with(want);
	*why = "cannot create a userfaultfd";
	if ((fd == -EPERM || fd == -EACCES) && g_uffd_dev < 0 && s >= 0) {
		int err = borrow_uffd_device(s, why);
		fd = err ? err : uffd_with(want);
	}
	if (fd == -EPERM) { /* EVENT_FORK needs CAP_SYS_PTRACE */
		want &= ~(uint64_t)UFFD_FEATURE_EVENT_FORK;
		fd = uffd_with(want);
	}
	if (fd < 0) {
		if (fd != -EPERM && fd != -EACCES)
			*why = "userfaultfd lacks the features the shim needs";
		return fd;
	}
	*features = want;
	return fd;
}

/* Registers every region of the table with fd (a forked child's own
 * uffd) in mode. Returns 0 or -errno. Preconditions: the only thread. */
static int register_all(int fd, uint64_t mode)
{
	for (int i = 0; i < g_nregions; i++) {
		struct uffdio_register reg = {
			.range = {.start = g_regions[i].base, .len = g_regions[i].len},
			.mode = mode,
		};
		if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0)
			return -errno;
	}
	return 0;
}

/* How a process says HELLO. */
enum hs {
	HS_TOP,        /* top-level: makes its uffd, sends it */
	HS_FORK_EVENT, /* child of a FORK event: the agent sends it its uffd */
	HS_FORK_OWN,   /* child of a fork without FORK events: makes a uffd,
			  registers the regions with it, sends it */
};

/* Connects, sends HELLO (with our uffd unless HS_FORK_EVENT) and takes the
 * WELCOME: maps the staging memfd; an HS_FORK_EVENT child also gets its
 * uffd. Returns 0 or -errno with *why set. Preconditions: init_mu held (or
 * the only thread, in a fork child). */
static int handshake(enum hs mode, const char **why)
{
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0) {
		*why = "socket";
		return -errno;
	}
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	memcpy(a.sun_path, g_sock_path, sizeof g_sock_path);
	if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
		int e = errno;
		close(s);
		*why = NULL;
		return -e;
	}
	/* An agent that accepts but never answers must not hang the program. */
	struct timeval tv = {.tv_sec = 30};
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	g_sock = s;
	if (mode == HS_TOP) {
		/* After connecting, so that "no agent" is what a process without
		 * an agent hears, whatever its userfaultfd rights. */
		int fd = open_uffd(s, &g_features, why);
		if (fd < 0) {
			close(s);
			g_sock = -1;
			return fd;
		}
		g_uffd = fd;
	} else if (mode == HS_FORK_OWN) {
		/* The parent's features: no FORK events, the same rights. */
		int fd = uffd_with(g_features);
		if (fd >= 0) {
			g_uffd = fd;
			fd = register_all(fd, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
		}
		if (fd < 0) {
			*why = "cannot register a userfaultfd of the child's own";
			if (g_uffd >= 0)
				close(g_uffd);
			g_uffd = -1;
			close(s);
			g_sock = -1;
			return fd;
		}
	}
	struct rmem_hello hello = {
		.pid = getpid(),
		.ppid = mode == HS_TOP ? getppid() : g_pid, /* the parent, not a reaper (daemon()) */
		.fork_serial = mode == HS_TOP ? 0 : g_fork_serial,
		.features = g_features,
		.page_size = (uint32_t)g_page,
		.flags = mode == HS_FORK_EVENT ? 0 : RMEM_HELLO_UFFD,
		.local_mem = g_local_mem,
	};
	int fds[RMEM_MAX_FDS], nfds = 0;
	struct rmem_hdr h;
	*why = "no usable reply to HELLO";
	int n = hs_request(s, RMEM_HELLO, &hello, sizeof hello, mode == HS_FORK_EVENT ? -1 : g_uffd,
			   "agent refused: ", &h, fds, &nfds, why);
	const char *body = g_hs_pkt.buf + sizeof h;
	if (n >= 0 && (h.type != RMEM_WELCOME || n != sizeof(struct rmem_welcome))) {
		*why = "unexpected reply to HELLO";
		n = -EPROTO;
	}
	struct rmem_welcome w;
	if (n >= 0) {
		memcpy(&w, body, sizeof w);
		int want = (w.flags & RMEM_WELCOME_UFFD) ? 2 : 1;
		struct stat st;
		if (w.staging_slots == 0 || w.staging_slots > RMEM_MAX_STAGING_SLOTS || nfds != want ||
		    (mode == HS_FORK_EVENT && want != 2) || fstat(fds[0], &st) != 0 ||
		    (uint64_t)st.st_size < (uint64_t)w.staging_slots * g_page) {
			*why = "bad WELCOME (staging area or descriptors)";
			n = -EPROTO;
		}
	}
	if (n >= 0) {
		size_t len = (size_t)w.staging_slots * g_page;
		void *p = raw_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
		if (p == MAP_FAILED) {
			*why = "mapping the staging area";
			n = -errno;
		} else {
			g_staging = p;
			g_slots = w.staging_slots;
		}
	}
	if (n < 0) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		close(s);
		g_sock = -1;
		if (mode != HS_FORK_EVENT) {
			close(g_uffd);
			g_uffd = -1;
		}
		return n;
	}
	close(fds[0]);
	if (mode == HS_FORK_EVENT)
		g_uffd = fds[1];
	else if (nfds == 2)
		close(fds[1]);
	if (!g_min_from_env && w.min_alloc > 0)
		g_min_alloc = (size_t)w.min_alloc;
	tv.tv_sec = 0;
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	memset(&g_reply, 0, sizeof g_reply);
	int err = g_helper_exists ? 0 : start_helper();
	if (err) {
		*why = "starting the helper thread";
		raw_munmap(g_staging, (size_t)g_slots * g_page);
		g_staging = NULL;
		close(s);
		g_sock = -1;
		close(g_uffd); /* ours, or the child's own from WELCOME */
		g_uffd = -1;
		return -err;
	}
	g_pid = getpid();
	sem_post(&g_conn_sem); /* the helper serves the new connection */
	return 0;
}

static void say_off(const char *why, int err)
{
	if (why)
		say("rmem: ", why, " (", strerror(err), "): using ordinary memory", NULL);
	else
		say("rmem: no agent at ", g_sock_path, " (", strerror(err), "): using ordinary memory", NULL);
}

/* Whether large allocations can go to the agent, connecting on first use.
 * Preconditions: in_shim set. */
static int connected(void)
{
	if (in_fork)
		return 0; /* our fork() holds init_mu */
	int st = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
	if (st != ST_UNINIT)
		return is_connected();
	if (g_foreign_malloc && !g_helper_exists)
		return 0; /* creating the helper here could deadlock (see g_conn_sem) */
	init_config();
	pthread_mutex_lock(&init_mu);
	if (g_state == ST_UNINIT) {
		const char *why = NULL;
		int err = handshake(HS_TOP, &why); /* opens the uffd once connected */
		if (err) {
			say_off(why, -err);
			set_off();
		} else {
			__atomic_store_n(&g_state, ST_CONNECTED, __ATOMIC_RELEASE);
		}
	}
	st = g_state;
	pthread_mutex_unlock(&init_mu);
	return st == ST_CONNECTED;
}

/* ---- regions ---- */

/* Registers [p, p+len) and announces it; on success the region is in the
 * table. Preconditions: req_mu held, connected. */
static int add_region_locked(void *p, size_t len, uintptr_t user, int kind)
{
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)p, .len = len},
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
	};
	pthread_mutex_lock(&table_mu);
	int full = g_nregions == MAX_REGIONS;
	pthread_mutex_unlock(&table_mu);
	if (full) {
		if (!__atomic_exchange_n(&g_full_said, 1, __ATOMIC_ACQ_REL))
			say("rmem: region table full: further large allocations use ordinary memory", NULL);
		return -ENOSPC;
	}
	if (ioctl(g_uffd, UFFDIO_REGISTER, &reg) != 0)
		return -errno;
	raw_madvise(p, len, MADV_DONTFORK); /* see "fork" below */
	struct region r = {(uintptr_t)p, len, user, g_next_id++, kind};
	struct rmem_region_add m = {r.id, r.base, r.len, (uint32_t)kind, 0};
	int err = request_locked(RMEM_REGION_ADD, &m, sizeof m);
	if (err) {
		ioctl(g_uffd, UFFDIO_UNREGISTER, &reg.range);
		return err;
	}
	pthread_mutex_lock(&table_mu);
	table_insert_locked(&r);
	pthread_mutex_unlock(&table_mu);
	return 0;
}

/* The first piece of [at, end) that lies in a region: returns 1 with the
 * region and the piece [*lo, *hi), or 0 when none is left. */
static int next_piece(uintptr_t at, uintptr_t end, struct region *r, uintptr_t *lo, uintptr_t *hi)
{
	if (at >= end)
		return 0;
	pthread_mutex_lock(&table_mu);
	int i = table_floor_locked(at);
	if (i < 0 || g_regions[i].base + g_regions[i].len <= at)
		i++;
	int found = i < g_nregions && g_regions[i].base < end;
	if (found)
		*r = g_regions[i];
	pthread_mutex_unlock(&table_mu);
	if (!found)
		return 0;
	*lo = r->base > at ? r->base : at;
	*hi = r->base + r->len < end ? r->base + r->len : end;
	return 1;
}

/* Takes [a, a+len) out of every region it overlaps: REGION_DEL for each
 * piece, then the table update. The caller unmaps afterwards. Returns 0 or
 * -ENOMEM if a split does not fit in the table (nothing is changed then).
 * Preconditions: req_mu held; a and len page aligned. */
static int punch_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len;
	for (;;) {
		struct region r;
		uintptr_t lo, hi;
		if (!next_piece(a, end, &r, &lo, &hi))
			return 0;
		/* Only req_mu holders change the table: the count is stable. */
		if (lo > r.base && hi < r.base + r.len && __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE) == MAX_REGIONS)
			return -ENOMEM;

		if (is_connected()) {
			struct rmem_region_del m = {r.id, lo, hi - lo};
			int err = request_locked(RMEM_REGION_DEL, &m, sizeof m);
			if (err && err != -EPIPE)
				say("rmem: agent refused REGION_DEL (", strerror(-err), "): unmapping anyway", NULL);
		}

		pthread_mutex_lock(&table_mu);
		int i = table_find_locked(lo);
		struct region *t = &g_regions[i];
		if (lo == t->base && hi == t->base + t->len) {
			table_remove_locked(i);
		} else if (lo == t->base) {
			t->len -= hi - lo;
			t->base = hi;
		} else if (hi == t->base + t->len) {
			t->len = lo - t->base;
		} else {
			struct region tail = *t;
			tail.base = hi;
			tail.len = t->base + t->len - hi;
			t->len = lo - t->base;
			table_insert_locked(&tail);
		}
		pthread_mutex_unlock(&table_mu);
	}
}

/* Tells the agent that [a, a+len) is being dropped (it reads as zeros from
 * now on): REGION_ZAP for each piece of a region it overlaps.
 * Preconditions: req_mu held; a and len page aligned. */
static void zap_locked(uintptr_t a, size_t len)
{
	uintptr_t end = a + len, at = a;
	struct region r;
	uintptr_t lo, hi;
	while (is_connected() && next_piece(at, end, &r, &lo, &hi)) {
		struct rmem_region_del m = {r.id, lo, hi - lo};
		int err = request_locked(RMEM_REGION_ZAP, &m, sizeof m);
		if (err && err != -EPIPE)
			say("rmem: agent refused REGION_ZAP (", strerror(-err), ")", NULL);
		at = hi;
	}
}

static int overlaps_regions(uintptr_t a, size_t len)
{
	if (!__atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&table_mu);
	int i = table_floor_locked(a + len - 1);
	int hit = i >= 0 && g_regions[i].base + g_regions[i].len > a;
	pthread_mutex_unlock(&table_mu);
	return hit;
}

/* A new heap region for size bytes at alignment align (a power of two);
 * NULL if it must come from glibc instead. Preconditions: in_shim set. */
static void *alloc_region(size_t size, size_t align)
{
	if (!connected() || !large(size)) /* the agent's min-alloc may be larger */
		return NULL;
	size_t extra = align > g_page ? align - g_page : 0;
	if (add_overflows(size, extra + g_page))
		return NULL;
	size_t len = round_up(size + extra, g_page);
	void *p = raw_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uintptr_t user = round_up((uintptr_t)p, align > g_page ? align : g_page);
	req_lock();
	int err = is_connected() ? add_region_locked(p, len, user, KIND_HEAP)
			  : -EPIPE;
	req_unlock();
	if (err) {
		raw_munmap(p, len);
		return NULL;
	}
	return (void *)user;
}

static void free_region(const struct region *r)
{
	if (in_fork && defer_unmap(r->base, r->len))
		return;
	req_lock();
	punch_locked(r->base, r->len); /* whole regions never need a split */
	req_unlock();
	raw_munmap((void *)r->base, r->len);
}

static size_t region_usable(const struct region *r, void *p)
{
	return r->len - ((uintptr_t)p - r->base);
}

/* ---- the malloc family ---- */

EXPORT void *malloc(size_t n)
{
	if (in_shim || !large(n))
		return __libc_malloc(n);
	in_shim++;
	void *p = alloc_region(n, 0);
	in_shim--;
	return p ? p : __libc_malloc(n);
}

EXPORT void *calloc(size_t n, size_t size)
{
	size_t total;
	if (__builtin_mul_overflow(n, size, &total) || in_shim || !large(total))
		return __libc_calloc(n, size);
	in_shim++;
	void *p = alloc_region(total, 0); /* fresh anonymous memory is zero */
	in_shim--;
	return p ? p : __libc_calloc(n, size);
}

EXPORT void free(void *p)
{
	struct region r;
	if (!p)
		return;
	if (!lookup_heap(p, &r)) {
		__libc_free(p);
		return;
	}
	in_shim++;
	free_region(&r);
	in_shim--;
}

/* Growing or moving a region copies it into a new one (the agent never
 * sees a REMAP of shim memory, see docs/pager.md). */
EXPORT void *realloc(void *p, size_t n)
{
	struct region r;
	if (!p)
		return malloc(n);
	if (in_shim)
		return __libc_realloc(p, n);
	if (!lookup_heap(p, &r)) {
		if (!large(n))
			return __libc_realloc(p, n);
		in_shim++;
		void *q = alloc_region(n, 0);
		in_shim--;
		if (!q)
			return __libc_realloc(p, n);
		size_t old = real_usable_size ? real_usable_size(p) : 0;
		memcpy(q, p, old < n ? old : n);
		__libc_free(p);
		return q;
	}
	if (n == 0) {
		free(p);
		return NULL;
	}
	size_t usable = region_usable(&r, p);
	if (n <= usable && large(n))
		return p;
	void *q = malloc(n);
	if (!q)
		return NULL;
	memcpy(q, p, usable < n ? usable : n);
	free(p);
	return q;
}

EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
	size_t total;
	if (__builtin_mul_overflow(n, size, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, total);
}

static void *aligned(size_t align, size_t n)
{
	if (in_shim || !large(n))
		return __libc_memalign(align, n);
	in_shim++;
	void *p = alloc_region(n, align);
	in_shim--;
	return p ? p : __libc_memalign(align, n);
}

static int pow2(size_t a) { return a && !(a & (a - 1)); }

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	if (!pow2(align) || align % sizeof(void *))
		return EINVAL;
	void *p = aligned(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	if (!pow2(align)) {
		errno = EINVAL;
		return NULL;
	}
	return aligned(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
	if (align > ((size_t)1 << 63)) {
		errno = EINVAL;
		return NULL;
	}
	if (!pow2(align)) /* glibc rounds up; so do we */
		align = align ? (size_t)1 << (64 - __builtin_clzl(align)) : 1;
	return aligned(align, n);
}

EXPORT void *valloc(size_t n) { return aligned(g_page, n); }

EXPORT void *pvalloc(size_t n)
{
	if (add_overflows(n, g_page)) {
		errno = ENOMEM;
		return NULL;
	}
	return aligned(g_page, round_up(n ? n : 1, g_page));
}

EXPORT size_t malloc_usable_size(void *p)
{
	struct region r;
	if (lookup_heap(p, &r))
		return region_usable(&r, p);
	if (!p)
		return 0;
	if (!real_usable_size) {
		in_shim++;
		init_config();
		in_shim--;
	}
	return real_usable_size ? real_usable_size(p) : 0;
}

/* ---- mmap, munmap, mremap ---- */

/* Which anonymous mmaps become regions: private read/write mappings the
 * kernel places (no MAP_FIXED: the caller picked the address and often
 * replaces part of its own reservation), not populated, locked, huge or
 * stacks. Passed through untouched: MAP_SHARED (paging it privately would
 * break the sharing), file mappings (the page cache pages them), and
 * PROT_NONE reservations: an allocator reserves address space and
 * mprotects pieces of it later, which would need mprotect interposed and
 * per-piece registration; such memory stays ordinary. jemalloc and
 * tcmalloc map read/write chunks directly, so their chunks are paged. */
static int mmap_eligible(size_t len, int prot, int flags)
{
	const int refuse = MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_POPULATE | MAP_HUGETLB |
			   MAP_GROWSDOWN | MAP_STACK | MAP_LOCKED;
	return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE && !(flags & refuse) &&
	       prot == (PROT_READ | PROT_WRITE) && large(len);
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (in_shim)
		return raw_mmap(addr, len, prot, flags, fd, off);
	if ((flags & MAP_FIXED) && !((uintptr_t)addr & (g_page - 1)) && len &&
	    !add_overflows((uintptr_t)addr, round_up(len, g_page)) &&
	    overlaps_regions((uintptr_t)addr, round_up(len, g_page))) {
		in_shim++;
		req_lock();
		int err = punch_locked((uintptr_t)addr, round_up(len, g_page));
		req_unlock();
		in_shim--;
		if (err) {
			errno = -err;
			return MAP_FAILED;
		}
		return raw_mmap(addr, len, prot, flags, fd, off);
	}
	if (!mmap_eligible(len, prot, flags) || !__atomic_load_n(&g_ctor_done, __ATOMIC_ACQUIRE))
		return raw_mmap(addr, len, prot, flags, fd, off);
	in_shim++;
	void *p = MAP_FAILED;
	if (connected() && large(len)) {
		p = raw_mmap(addr, len, prot, flags, fd, off);
		if (p != MAP_FAILED) {
			int e = errno;
			req_lock();
			if (is_connected())
				add_region_locked(p, round_up(len, g_page), 0, KIND_MMAP);
			req_unlock();
			errno = e; /* a refused region stays ordinary memory */
		}
	} else {
		p = raw_mmap(addr, len, prot, flags, fd, off);
	}
	in_shim--;
	return p;
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((alias("mmap")));

EXPORT int munmap(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	if (in_shim || (a & (g_page - 1)) || !len || add_overflows(a, round_up(len, g_page)) ||
	    !overlaps_regions(a, round_up(len, g_page)))
		return raw_munmap(addr, len);
	if (in_fork && defer_unmap(a, round_up(len, g_page)))
		return 0;
	in_shim++;
	req_lock();
	int err = punch_locked(a, round_up(len, g_page));
	req_unlock();
	in_shim--;
	if (err) {
		errno = -err;
		return -1;
	}
	return raw_munmap(addr, len);
}

static int drops_pages(int advice)
{
	switch (advice) {
	case MADV_DONTNEED:
	case MADV_FREE:
	case MADV_REMOVE:
#ifdef MADV_DONTNEED_LOCKED
	case MADV_DONTNEED_LOCKED:
#endif
		return 1;
	}
	return 0;
}

/* madvise that drops pages of a shim region (allocators give memory back
 * this way) is preceded by REGION_ZAP, so that the agent forgets its
 * copies of those pages: they read as zeros from now on. The agent hears
 * first, so that an evicted page never comes back with old contents after
 * madvise returned, and an eviction in flight (whose EVICT the helper
 * finishes before it reads our ACK) never copies a page the kernel just
 * dropped. A raw madvise system call bypasses this: evicted pages it names
 * would come back with their old contents (docs/pager.md). */
EXPORT int madvise(void *addr, size_t len, int advice)
{
	uintptr_t a = (uintptr_t)addr;
	if (in_shim || !drops_pages(advice) || (a & (g_page - 1)) || !len ||
	    add_overflows(a, round_up(len, g_page)) || !overlaps_regions(a, round_up(len, g_page)))
		return raw_madvise(addr, len, advice);
	in_shim++;
	req_lock();
	zap_locked(a, round_up(len, g_page));
	req_unlock();
	in_shim--;
	return raw_madvise(addr, len, advice);
}

/* mremap of a shim region: shrinking in place unmaps the tail; moving or
 * growing (MREMAP_MAYMOVE) copies into a new mapping; growing in place
 * fails with ENOMEM (as the kernel does when the neighbour is taken);
 * MREMAP_DONTUNMAP is refused (EINVAL). Other mappings go to the kernel. */
EXPORT void *mremap(void *old, size_t oldlen, size_t newlen, int flags, ...)
{
	void *want = NULL;
	if (flags & MREMAP_FIXED) {
		va_list ap;
		va_start(ap, flags);
		want = va_arg(ap, void *);
		va_end(ap);
	}
	uintptr_t a = (uintptr_t)old;
	size_t ol = round_up(oldlen, g_page), nl = round_up(newlen, g_page);
	if (in_shim || (a & (g_page - 1)) || !oldlen || !newlen || add_overflows(a, ol) ||
	    !overlaps_regions(a, ol))
		return (void *)syscall(SYS_mremap, old, oldlen, newlen, flags, want);
	if (flags & MREMAP_DONTUNMAP) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	if (nl <= ol && !(flags & MREMAP_FIXED)) {
		if (nl < ol && munmap((void *)(a + nl), ol - nl) != 0)
			return MAP_FAILED;
		return old;
	}
	if (!(flags & MREMAP_MAYMOVE)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	void *q = (flags & MREMAP_FIXED)
			  ? mmap(want, newlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
			  : mmap(NULL, newlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED)
		return MAP_FAILED;
	memcpy(q, old, oldlen < newlen ? oldlen : newlen);
	munmap(old, oldlen);
	return q;
}

/* ---- fork ----
 *
 * fork() is wrapped, and forks made inside the C library (glibc's
 * daemon()) are caught by atfork handlers; both go through fork_prepare,
 * fork_parent and fork_child. The wrapper is preferred where it runs
 * because the FORK-event serial must count only forks that happened: it
 * sees what fork(2) returned, while an atfork parent handler cannot tell a
 * failed fork from a successful one (a serial counted for a fork that
 * raised no event would pair the next child with another child's uffd).
 * Both hold init_mu and req_mu across the fork (no request in flight, the
 * table stable); the kernel raises the FORK event only when some vma is
 * registered, i.e. when the table is not empty.
 *
 * Without FORK events (the uffd has none unless the process has
 * CAP_SYS_PTRACE), the child's regions are plain memory with the evicted
 * pages missing: FORK_PREPARE has the agent make the child's copy of its
 * page table (sharing the pooled pages) before fork(2), the child registers the regions with a uffd of its own before
 * fork() returns to it (HS_FORK_OWN), and FORK_DONE tells the agent how
 * fork(2) went (pid 0 from an atfork parent handler: not known). In the
 * wrapper, other libraries' atfork child handlers run before ours, inside
 * fork(2); what they touch is what their prepare handlers just touched
 * (their locks), resident in the parent, so inherited.
 *
 * _Fork() and raw clones run no handlers: nothing would serve the child's
 * regions (without FORK events its evicted pages would read as zeros) and,
 * with FORK events, the event they raise would go uncounted, pairing the
 * parent's next child with this one's uffd. So regions are MADV_DONTFORK
 * except across the forks we see: such a child does not inherit them at
 * all (touching one raises SIGSEGV, see is_connected), and no FORK event is
 * raised for it. */

/* Sets advice (MADV_DOFORK, MADV_DONTFORK) on every region.
 * Preconditions: req_mu held (no writer of the table; the helper only
 * reads it), or the only thread. */
static void fork_advice_locked(int advice)
{
	for (int i = 0; i < g_nregions; i++)
		raw_madvise((void *)g_regions[i].base, g_regions[i].len, advice);
}

/* A child forked without FORK events that could not get its own uffd
 * served: the pages the pool held for it are lost to it. They must fail
 * loudly, not read as zeros: a uffd with UFFD_FEATURE_SIGBUS turns every
 * missing page of its regions into SIGBUS. Without even that, the child
 * cannot run safely. */
static void child_lost_pages(const char *why, int err)
{
	say("rmem: forked child: ", why, err ? " (" : "", err ? strerror(err) : "", err ? ")" : "",
	    ": the pages of its large allocations that were in the pool are lost to it; touching them raises SIGBUS", NULL);
	int fd = uffd_with(UFFD_FEATURE_SIGBUS);
	if (fd >= 0 && register_all(fd, UFFDIO_REGISTER_MODE_MISSING) == 0) {
		g_uffd = fd;
		return; /* fd stays open: closing it would unregister */
	}
	say("rmem: forked child cannot guard its lost pages: exiting", NULL);
	_exit(127);
}

static void child_after_fork(int had_regions)
{
	pthread_mutex_init(&init_mu, NULL);
	pthread_mutex_init(&req_mu, NULL);
	pthread_mutex_init(&table_mu, NULL);
	pthread_mutex_init(&reply_mu, NULL);
	pthread_cond_init(&reply_cv, NULL);
	memset(&g_reply, 0, sizeof g_reply);
	sem_init(&g_conn_sem, 0, 0);
	g_helper_exists = 0; /* threads do not survive fork */
	int own = had_regions && !(g_features & UFFD_FEATURE_EVENT_FORK);
	if (g_foreign_malloc && start_helper() != 0) {
		if (own) /* before our regions go unguarded */
			child_lost_pages("cannot start the helper thread", EAGAIN);
		else
			say("rmem: cannot start the helper thread in a child: using ordinary memory", NULL);
		g_state = ST_OFF;
		return;
	}
	if (g_state != ST_CONNECTED)
		return;
	/* The parent's: its socket, its uffd (registering through it would
	 * register in the parent's address space) and its staging area. */
	close(g_sock);
	g_sock = -1;
	close(g_uffd);
	g_uffd = -1;
	raw_munmap(g_staging, (size_t)g_slots * g_page);
	g_staging = NULL;
	if (!had_regions) {
		g_state = ST_UNINIT; /* starts over as a top-level process */
		g_fork_serial = 0;
		return;
	}
	const char *why = NULL;
	int err = handshake(own ? HS_FORK_OWN : HS_FORK_EVENT, &why);
	g_fork_serial = 0; /* the child's own forks count from 0 */
	if (err) {
		if (own)
			child_lost_pages(why ? why : "no agent", -err);
		else
			say_off(why, -err);
		g_state = ST_OFF;
	}
}

/* The fork in progress in this thread (prepare to parent/child). */
static TLS struct {
	int active;      /* prepared by us: parent or child must finish it */
	int had_regions; /* the child inherits regions */
	int own;         /* no FORK events: FORK_PREPARE, a uffd of the child's own */
	int prepared;    /* FORK_PREPARE was ACKed: FORK_DONE must follow */
} t_fork;
static TLS int t_fork_wrapper; /* our fork() is in fork(2): the atfork handlers stand aside */

/* Before fork(2). Returns 0, or -errno when the agent cannot keep the
 * pooled pages for the child (the wrapper then fails fork() with ENOMEM;
 * a fork in the C library goes on, and the child's HELLO, finding no
 * copy, gives it the SIGBUS guard). */
static int fork_prepare(void)
{
	pthread_mutex_lock(&init_mu);
	pthread_mutex_lock(&req_mu);
	t_fork.active = 1;
	t_fork.had_regions = g_state == ST_CONNECTED && getpid() == g_pid &&
			     __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE) > 0;
	t_fork.own = t_fork.had_regions && !(g_features & UFFD_FEATURE_EVENT_FORK);
	t_fork.prepared = 0;
	if (t_fork.had_regions)
		g_fork_serial++;
	int err = 0;
	if (t_fork.own) {
		struct rmem_fork f = {.serial = g_fork_serial};
		in_shim++;
		err = request_locked(RMEM_FORK_PREPARE, &f, sizeof f);
		in_shim--;
		t_fork.prepared = err == 0;
	}
	if (t_fork.had_regions)
		fork_advice_locked(MADV_DOFORK); /* fork_parent and fork_child undo it */
	in_fork = 1;
	return err;
}

/* In the parent after fork(2): pid is what it returned, 0 if not known
 * (an atfork handler), or -errno. */
static void fork_parent(pid_t pid)
{
	in_fork = 0;
	t_fork.active = 0;
	in_shim++;
	if (t_fork.had_regions)
		fork_advice_locked(MADV_DONTFORK);
	if (t_fork.prepared) {
		struct rmem_fork f = {.serial = g_fork_serial, .pid = pid};
		send_packet(RMEM_FORK_DONE, ++g_seq, &f, sizeof f, -1);
	}
	run_deferred_locked();
	if (pid < 0 && t_fork.had_regions && !t_fork.own) {
		g_fork_serial--; /* no child, and most failures come before the FORK event */
		say("rmem: fork failed (", strerror(-pid),
		    "); if the kernel had raised its FORK event, later children are paired wrongly", NULL);
	}
	in_shim--;
	pthread_mutex_unlock(&req_mu);
	pthread_mutex_unlock(&init_mu);
}

/* In the child after fork(2). */
static void fork_child(void)
{
	in_fork = 0;
	t_fork.active = 0;
	in_shim++;
	if (t_fork.had_regions)
		fork_advice_locked(MADV_DONTFORK);
	child_after_fork(t_fork.had_regions);
	pthread_mutex_lock(&req_mu);
	run_deferred_locked();
	pthread_mutex_unlock(&req_mu);
	in_shim--;
}

/* The atfork handlers: a fork the wrapper did not start (in_fork is set
 * while it runs fork(2)); in_shim: one of ours, of a process without
 * regions. */
static void atfork_prepare(void)
{
	if (in_fork || in_shim)
		return;
	int e = errno;
	if (fork_prepare() != 0) {
		in_shim++;
		say("rmem: the agent cannot keep this process's pooled pages for a child forked inside the C library"
		    " (daemon()): the child gets SIGBUS on them",
		    NULL);
		in_shim--;
	}
	errno = e;
}

static void atfork_parent(void)
{
	if (t_fork.active && !t_fork_wrapper) {
		int e = errno;
		fork_parent(0);
		errno = e;
	}
}

static void atfork_child(void)
{
	if (t_fork.active && !t_fork_wrapper) {
		int e = errno;
		fork_child();
		errno = e;
	}
}

EXPORT pid_t fork(void)
{
	in_shim++;
	init_config();
	in_shim--;
	if (!real_fork) {
		errno = ENOSYS;
		return -1;
	}
	if (in_shim)
		return real_fork();
	int err = fork_prepare();
	if (err) {
		in_shim++;
		say("rmem: fork refused: the agent cannot keep this process's pooled pages for a child (",
		    strerror(-err), ")", NULL);
		in_shim--;
		t_fork.prepared = 0;
		fork_parent(-ENOMEM);
		errno = ENOMEM;
		return -1;
	}
	t_fork_wrapper = 1;
	pid_t pid = real_fork();
	t_fork_wrapper = 0;
	int e = errno;
	if (pid == 0) {
		fork_child();
		errno = e;
		return 0;
	}
	fork_parent(pid < 0 ? -e : pid);
	errno = e;
	return pid;
}
