/* librmem.so internals: the one header of the shim's files (what the shim
 * does and why: ../doc.go and docs/pager.md). A section per file below.
 *
 * The files in layers, top to bottom: a file calls and reads only what
 * files below it define (make shim-layers checks it; the one exception is
 * alloc.c's decide registering fork.c's atfork handlers, which the first
 * call into the shim must do, and fork() is such a call):
 *
 *   fork.c       fork() and the atfork handlers
 *   spawn.c      posix_spawn, system, popen, exec (HANDOFF; ring mode)
 *   kcall.c      system calls with buffers: read, write, recv, send,
 *                stat... pinned and made present first (ring mode)
 *   kmisc.c      the same for paths and small structs (open, pipe...)
 *   kwait.c      waits, futexes, glibc's locks, sigaltstack, syscall(3)
 *   sigwrap.c    signal masks without SIGBUS, SIGBUS dispositions
 *                recorded (ring mode)
 *   interpose.c  mmap, munmap, mremap, madvise, mprotect, sbrk
 *   alloc.c      the malloc family, deciding the mode, the constructor
 *   heap.c       glibc mode's heap: the embedded jemalloc's memory
 *   region.c     how memory becomes, changes and stops being a region:
 *                connecting on first use, REGION_ADD/DEL/ZAP, MAP_FIXED
 *                over regions, madvise and mprotect of regions
 *   sigbus.c     ring mode's SIGBUS handler, the program's disposition
 *   helper.c     the helper thread: replies and EVICT
 *   resume.c     the helper looking for the next agent
 *   ring.c       the fault ring, the shim's side: post and wait; the
 *                orphaned helper's answers
 *   pin.c        pins of system calls' buffers against eviction, and
 *                touching them present (ring mode)
 *   handoff.c    descriptors leaving the agent's sight (exec, SCM_RIGHTS,
 *                read/write through a mapped one): HANDOFF first
 *   conn.c       the connection: its state and the transitions that
 *                change it, requests
 *   wire.c       packets, new userfaultfds, the handshake (HELLO by mode)
 *   table.c      the region table and the pending ranges
 *   mode.c       the mode (as decided by alloc.c) and this thread's guards
 *   util.c       configuration, say(), raw system calls
 *
 * Each piece of shared state has one file that writes it; the others call
 * that file's functions (transitions, accessors): the connection (conn.c),
 * the region table and pending ranges (table.c), the mode and the
 * per-thread guards (mode.c), the configuration (util.c), the helper
 * thread (helper.c), the heap's reservation (heap.c). The few variables
 * declared here are read directly for speed and written by their file
 * only. Every symbol shared between files starts with rm_ (jemalloc's,
 * renamed by build.sh: rm_je_*, and the system calls it makes: rm_heap_*);
 * the exported ones are the interposed names (malloc, mmap, fork, ...).
 *
 * Locks, in this order (a thread holding one takes only later ones):
 *
 *   fork_mu    a fork in progress: from our atfork prepare handler to
 *              the end of the fork (fork.c)
 *   allocator  the embedded jemalloc's locks (glibc mode; fork.c calls
 *              its fork handlers), or a foreign allocator's, which hold
 *              them when they call our mmap, munmap, madvise or sbrk
 *   mode_mu    deciding the mode (alloc.c)
 *   init_mu    setting the connection up: connect, fork (conn.c)
 *   req_mu     one request to the agent at a time; only its holder
 *              changes the region table's layout (conn.c)
 *   heap_mu    the heap's bump pointer (heap.c; leaf)
 *   table_mu   the region table and the pending list (table.c)
 *   reply_mu   the hand-over of replies from the helper thread, and the
 *              state's waiters (conn.c)
 *
 * The helper thread takes only table_mu and reply_mu, and nothing it does
 * under them touches paged memory except the resident victims it copies:
 * shim state lives in .bss, never in a region (a fault there would wait
 * for an agent that waits for the helper).
 *
 * What a signal handler may read (no locks, nothing it could interrupt
 * half done): the accessors marked "signal-safe" (atomic loads), the
 * variables declared here, and rm_page. Ring mode's SIGBUS handler
 * (sigbus.c, ring.c) runs inside any code of the program's, the shim's
 * included: it takes no lock, calls no libc function but the
 * async-signal-safe clock_gettime, and makes its system calls raw.
 *
 * The shim's own system calls are raw (rm_sys6) and its locks are taken
 * with glibc's functions behind rm_lock, rm_cond_wait and rm_sem_wait:
 * never through the names the shim interposes for the program.
 *
 * Nothing here may allocate through the shim. Shim code runs with the
 * per-thread guard in_shim set (rm_shim_enter): its allocations (by libc
 * functions it calls, dlsym, pthread_create) go to glibc in glibc mode and
 * to the foreign allocator in foreign mode, and its mmaps are raw. Code
 * that can run inside another allocator's mmap call (the whole mmap,
 * munmap, madvise and sbrk paths, the handshake) allocates nothing at all.
 */
#ifndef RMEM_H
#define RMEM_H

#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../proto.h"

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define TLS __attribute__((tls_model("initial-exec"))) __thread
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* The threshold for direct mmaps (and sbrk) becoming regions; malloc is
 * paged whole in glibc mode (heap.c). 64 KiB: the allocators that map
 * their own memory do it in pieces of 64 KiB (CPython's obmalloc arenas
 * since 3.10 are 1 MiB, mimalloc's segments 32 MiB, jemalloc's extents
 * and tcmalloc's spans 2 MiB and up, both from 64 KiB...), and smaller
 * mappings are a program's own business (guard pages, rings). A region
 * costs one REGION_ADD round trip (~100-250 us with the test agent) and a
 * table slot. RMEM_MIN_ALLOC and WELCOME change it. */
#define DEFAULT_MIN_ALLOC (64u << 10)

/* Mappings larger than this stay ordinary memory: the agent keeps a page
 * table of a byte per page for each region (64 GiB is 16 MiB of it), and
 * runtimes reserve address space by the terabyte (PROT_NONE, never all
 * used) that would each cost the agent that much for nothing. */
#define MAX_REGION_LEN (64ull << 30)

/* Region table capacity; past it new memory is ordinary (said once). */
#define MAX_REGIONS 16384

/* The connection's state (conn.c). ST_RESUMING: the agent went away and
 * the helper looks for the next one (resume.c): requests wait.
 * ST_ORPHANED: none came in time: requests fail, faults get SIGBUS, the
 * helper still looks. */
enum state { ST_UNINIT, ST_CONNECTED, ST_OFF, ST_RESUMING, ST_ORPHANED };
/* Region kinds. KIND_HEAP and KIND_MMAP are private anonymous memory;
 * KIND_SHARED is a MAP_SHARED mapping of shared memory (interpose.c says
 * which), whose pages are the segment's, not this process's: the agent
 * pages them once for every process that maps it. What differs for it:
 * dropping pages (MADV_DONTNEED, MADV_FREE) is no REGION_ZAP, MADV_REMOVE
 * is (region.c's rm_madvise); MAP_FIXED over it is REGION_DEL, never
 * REGION_ZAP (rm_map_fixed_locked); mremap does not move or grow it
 * (interpose.c); the helper refuses an EVICT of it (helper.c). */
enum kind { KIND_HEAP = RMEM_KIND_HEAP, KIND_MMAP = RMEM_KIND_MMAP, KIND_SHARED = RMEM_KIND_SHARED };

/* Region flags. R_UNREADABLE: some page was mprotect-ed without read
 * access, resident pages may be inaccessible: the helper copies its victims
 * through /proc/self/mem (reading one would kill the process). R_NOTRW:
 * some page was mapped or mprotect-ed without read and write access:
 * mremap, which copies regions, refuses to move it. (A fresh PROT_NONE
 * mapping has no resident pages; pages become resident only through
 * access, or through the agent installing pooled ones, which were
 * accessible once, so only mprotect makes resident pages unreadable.) */
#define R_UNREADABLE 1
#define R_NOTRW 2

struct region {
	uintptr_t base; /* page aligned */
	size_t len;     /* page multiple */
	uint64_t id;
	int kind;
	int flags;
};

/* The mode (decided by alloc.c, kept by mode.c). */
enum mode {
	MODE_UNKNOWN, /* not decided yet */
	MODE_GLIBC,   /* the shim is the allocator: the embedded jemalloc */
	MODE_FOREIGN, /* another allocator: every malloc call goes to it */
	MODE_LIBC,    /* glibc mode without a heap (no reservation): glibc */
	MODE_LOST,    /* a child forked past fork(3) that lost its heap */
};

/* ---- util.c: configuration, say(), raw system calls (nothing here allocates) ---- */
HIDDEN extern size_t rm_page; /* set once, by rm_init_config */
/* RMEM_IN_THREAD=1: ring mode is asked for (set once, by rm_init_config):
 * the uffd raises SIGBUS and faults go through the fault ring (ring.c). */
HIDDEN extern int rm_in_thread;
#define RMEM_ENV_IN_THREAD "RMEM_IN_THREAD"
typedef pid_t rm_fork_fn(void);
typedef void *rm_sbrk_fn(intptr_t);
HIDDEN void rm_init_config(void);
HIDDEN size_t rm_min_alloc(void);
HIDDEN void rm_offer_min_alloc(uint64_t v);
HIDDEN uint64_t rm_local_mem(void);
HIDDEN uint32_t rm_max_slowdown(void);
HIDDEN const char *rm_sock_path(void);
HIDDEN rm_fork_fn *rm_real_fork(void);
HIDDEN rm_sbrk_fn *rm_real_sbrk(void);
HIDDEN void rm_say(const char *first, ...);
HIDDEN const char *rm_errstr(int err);
HIDDEN void *rm_raw_mmap(void *a, size_t len, int prot, int flags, int fd, off_t off);
HIDDEN int rm_raw_munmap(void *a, size_t len);
HIDDEN int rm_raw_madvise(void *a, size_t len, int advice);
HIDDEN int rm_raw_mprotect(void *a, size_t len, int prot);
HIDDEN size_t rm_parse_size(const char *s, int *ok);
HIDDEN void *rm_libc(const char *name);
/* The shim's own locks, through glibc's functions: never through the
 * interposed names (kwait.c), whose wrappers are for the program's. */
HIDDEN int rm_lock(pthread_mutex_t *m);
HIDDEN int rm_cond_wait(pthread_cond_t *c, pthread_mutex_t *m);
HIDDEN int rm_sem_wait(sem_t *s);

/* A system call without libc: the result, or -errno (errno untouched).
 * The shim's own system calls go this way, never through the names it
 * interposes (kcall.c, kwait.c), and a signal handler may use it. */
static inline long rm_sys6(long n, long a, long b, long c, long d, long e, long f)
{
#if defined(__x86_64__)
	long r;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return r;
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
	return x0;
#else
#error "rm_sys6: add this architecture's system call"
#endif
}
/* The C library's function name behind one of our wrappers, looked up
 * once into the function pointer p (rm_libc). */
#define RM_REAL(p, name)                                                       \
	({                                                                     \
		if (!p)                                                        \
			p = (__typeof__(p))rm_libc(name);                      \
		p;                                                             \
	})
/* RM_REAL of the C library's NAME kept in real_NAME (the wrappers'
 * convention). */
#define RM_RESOLVE(name) RM_REAL(real_##name, #name)
#define rm_sys(n, a, b, c) rm_sys6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define rm_sys4(n, a, b, c, d) rm_sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
/* rm_sys's result as libc gives it: -1 with errno set on failure. */
HIDDEN long rm_sysret(long r);

static inline size_t round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }
static inline int add_overflows(size_t a, size_t b) { return a + b < a; }
/* Whether [a, a+len) is a page-aligned, non-empty range that does not
 * wrap once len is rounded up to pages. */
static inline int page_range(uintptr_t a, size_t len)
{
	return !(a & (rm_page - 1)) && len && !add_overflows(a, round_up(len, rm_page));
}

/* ---- mode.c: the mode, and this thread's guards ---- */
/* This thread's guards, written by the functions below only. */
struct rm_guard {
	int in_shim; /* shim code runs: allocations go around the heap, mmaps are raw */
	int in_fork; /* between our fork prepare and parent/child handlers */
	int boot;    /* allocations come from the bootstrap arena */
};
HIDDEN extern TLS struct rm_guard rm_guard;
/* The mode as this image of the process sees it (see mode.c). */
HIDDEN extern int *rm_modep;
static inline int rm_in_shim(void) { return rm_guard.in_shim; }
static inline int rm_in_fork(void) { return rm_guard.in_fork; }
static inline int rm_in_boot(void) { return rm_guard.boot; }
static inline int rm_mode_here(void) { return *rm_modep; }
HIDDEN void rm_shim_enter(void);
HIDDEN void rm_shim_leave(void);
HIDDEN void rm_set_in_fork(int on);
HIDDEN void rm_set_boot(int on);
HIDDEN int rm_mode(void); /* the mode decided, MODE_UNKNOWN before; signal-safe */
HIDDEN int rm_mode_astray(void);
HIDDEN void rm_mode_page_init(int m);
HIDDEN void rm_mode_publish(int m);
HIDDEN void rm_mode_fork_child(int lost_heap);

/* ---- table.c: the region table and the pending ranges ---- */
HIDDEN void rm_table_lock(void);
HIDDEN void rm_table_unlock(void);
HIDDEN void rm_table_atfork_child(void);
HIDDEN int rm_table_count(void); /* signal-safe */
HIDDEN int rm_table_full(void);
HIDDEN struct region rm_table_at_locked(int i);
HIDDEN int rm_table_covers_locked(uintptr_t a, size_t len, int *flags, int *kind);
HIDDEN int rm_table_overlaps(uintptr_t a, size_t len);
HIDDEN int rm_table_span(uintptr_t a, uintptr_t *end, int *flags); /* lock-free, signal-safe */
HIDDEN int rm_table_next_piece(uintptr_t at, uintptr_t end, struct region *r, uintptr_t *lo, uintptr_t *hi);
HIDDEN void rm_table_insert(const struct region *r);
HIDDEN void rm_table_cut(uintptr_t lo, uintptr_t hi);
HIDDEN void rm_table_mark(uintptr_t a, size_t len, int flags);
HIDDEN int rm_table_register_all(int fd, uint64_t mode);
HIDDEN void rm_table_fork_advice(int advice);
HIDDEN void rm_table_fence(void);
HIDDEN int rm_table_has_heap(void);
HIDDEN void rm_pending_add(uintptr_t a, size_t len, int kind, int prot);
HIDDEN int rm_pending_count(void);
HIDDEN void rm_pending_drop(uintptr_t a, size_t len);
HIDDEN int rm_pending_pop(uintptr_t *a, size_t *len, int *kind, int *prot);

/* ---- wire.c: packets, new userfaultfds, the handshake ---- */
/* What a handshake brings: a connection not yet the process's (conn.c
 * adopts it). */
struct rm_session {
	int sock;
	int uffd;       /* the uffd the agent serves */
	int staging_fd; /* the staging memfd */
	char *staging;  /* mapped */
	uint32_t slots;
	uint64_t features;  /* the uffd's (a fork child: its parent's) */
	uint64_t min_alloc; /* WELCOME's; 0: none */
	struct rmem_ring *ring; /* ring mode: the fault ring, in the staging mapping */
	int doorbell;           /* ring mode: the agent's eventfd; else -1 */
};
HIDDEN uint32_t rm_next_seq(void);
HIDDEN int rm_send(int sock, uint16_t type, uint32_t seq, const void *body, uint32_t len, int fd);
HIDDEN int rm_send_fds(int sock, uint16_t type, uint32_t seq, const void *body, uint32_t len, const int *fds,
		       int nfds);
HIDDEN int rm_recv(int sock, void *buf, struct rmem_hdr *h, int *fds, int *nfds);
HIDDEN int rm_uffd_with(uint64_t features);
HIDDEN int rm_hello_top(struct rm_session *s, const char **why);
HIDDEN int rm_hello_fork_event(struct rm_session *s, pid_t parent, uint64_t features, uint64_t serial,
			       const char **why);
HIDDEN int rm_hello_fork_own(struct rm_session *s, pid_t parent, uint64_t features, uint64_t serial,
			     const char **why);
HIDDEN int rm_hello_resume(const struct rm_session *cur, int *journaled, int *doorbell);

/* A request on a connection of its own, closed after the reply:
 * 0, -errno of an ERROR, or another -errno (no agent). */
HIDDEN int rm_request_once(uint16_t type, const void *body, uint32_t len);

/* ---- conn.c: the connection ---- */
/* A fork as the connection sees it: filled by rm_conn_fork_prepare, kept
 * by fork.c for the parent's, the wrapper's and the child's steps. */
struct rm_fork {
	int state;       /* the connection's state at the fork */
	int had_regions; /* connected with regions: the child gets them served */
	int own;         /* no FORK events: FORK_PREPARE, a uffd of the child's own */
	int prepared;    /* FORK_PREPARE was ACKed: FORK_DONE must follow */
	int refused;     /* FORK_PREPARE failed with this -errno */
	int lost;        /* the agent was lost, regions remain: RM_LOST_* */
	int inherit;     /* the child inherits the regions (MADV_DOFORK across) */
	uint64_t serial;
};
/* A fork of a process that lost its agent (orphaned, off) but holds
 * regions (conn.c): */
#define RM_LOST_GUARD 1 /* the child inherits them and guards their pooled pages (SIGBUS) */
#define RM_LOST_FENCE 2 /* the child does not inherit them: fenced (SIGSEGV) */
HIDDEN void rm_conn_init(void);
HIDDEN int rm_conn_state(void);   /* signal-safe */
HIDDEN int rm_conn_uffd(void);    /* signal-safe */
HIDDEN char *rm_conn_staging(void); /* signal-safe */
HIDDEN uint32_t rm_conn_slots(void); /* signal-safe */
HIDDEN struct rmem_ring *rm_conn_ring(void); /* signal-safe; NULL: no fault ring */
HIDDEN int rm_conn_doorbell(void);  /* signal-safe */
HIDDEN pid_t rm_conn_pid(void);     /* signal-safe: the process that made the connection */
/* Ring mode: the process's faults go through its fault ring (conn.c sets
 * it with the ring; the wrappers of kcall.c and kwait.c read it first). */
HIDDEN extern int rm_ring_mode;
HIDDEN int rm_conn_sock(void);
HIDDEN int rm_conn_mem_fd(void);
HIDDEN int rm_conn_is_connected(void);
HIDDEN int rm_conn_await(void);
HIDDEN void rm_conn_wait_resumed(void);
HIDDEN int rm_conn_connect(int *now);
HIDDEN void rm_conn_lost(int err);
HIDDEN int rm_conn_resume(int *journaled);
HIDDEN void rm_conn_orphan(void);
HIDDEN void rm_conn_astray(void);
HIDDEN void rm_conn_fork_prepare(struct rm_fork *f, int wrapper);
HIDDEN void rm_conn_fork_parent(const struct rm_fork *f, int wrapper);
HIDDEN void rm_conn_fork_done(const struct rm_fork *f, pid_t pid, int err);
HIDDEN int rm_conn_atfork_child(const struct rm_fork *f);
HIDDEN void rm_conn_fork_adopt(const struct rm_fork *f, int helper_err);
HIDDEN int rm_conn_fork_event(void);
HIDDEN int rm_request_locked(uint16_t type, const void *body, uint32_t len);
HIDDEN void rm_deliver_reply(uint32_t seq, int err);
HIDDEN void rm_req_lock(void);
HIDDEN void rm_req_unlock(void);

/* ---- handoff.c: descriptors leaving the agent's sight ---- */
/* This process connected (region.c): it, and every child forked from it,
 * may hold a descriptor of a segment the agent pages. */
HIDDEN void rm_handoff_connected(void);
/* Each returns 0, or -EPERM: the agent refuses (a segment whose pages the
 * pool lost), the call is to fail with EPERM. */
struct msghdr;
/* This process (or a child of vfork) is about to exec: its descriptors
 * kept across it, and fds[:n] (dup2'd there by posix_spawn's actions). */
HIDDEN int rm_handoff_exec(const int *fds, size_t n);
/* count messages, stride bytes apart, are about to be sent: the
 * descriptors they pass (SCM_RIGHTS). */
HIDDEN int rm_handoff_msgs(const struct msghdr *m, size_t count, size_t stride);
/* Descriptors below RM_WATCH_FDS this process mapped shared memory
 * through (rm_watch_fd, interpose.c): a read or write through one is
 * told first (rm_handoff_io). */
#define RM_WATCH_FDS 4096
extern HIDDEN uint64_t rm_watched_fds[RM_WATCH_FDS / 64];
static inline int rm_fd_watched(int fd)
{
	return (unsigned)fd < RM_WATCH_FDS && (__atomic_load_n(&rm_watched_fds[fd / 64], __ATOMIC_RELAXED) >> (fd % 64)) & 1;
}
HIDDEN void rm_watch_fd(int fd);
/* fd, watched, is about to be read or written: once per watch. */
HIDDEN int rm_handoff_io(int fd);

/* ---- pin.c: pins, touching (ring mode) ---- */
/* A system call's pins, from rm_pin_begin to rm_pin_end. */
struct rm_pin {
	int slot; /* this thread's slot in the table; -1: none (all) */
	int base; /* the slot's depth before this call */
	int all;  /* everything is pinned */
};
HIDDEN void rm_pin_begin(struct rm_pin *p);
HIDDEN void rm_pin_range(struct rm_pin *p, const void *a, size_t len);
HIDDEN void rm_pin_everything(struct rm_pin *p);
HIDDEN void rm_pin_publish(struct rm_pin *p);
HIDDEN void rm_pin_end(struct rm_pin *p);
HIDDEN int rm_pin_altstack(const void *a, size_t len);
HIDDEN void rm_pin_atfork_child(void);
HIDDEN uint32_t rm_pin_evict_begin(const struct rmem_evict_page *v, uint32_t n);
HIDDEN void rm_pin_evict_end(void);
HIDDEN void rm_touch(const void *a, size_t len, int write);
/* A system call's buffers: the wrappers (kcall.c, kwait.c, kmisc.c) pin
 * them, make them present (rm_bufs_pin) and call; beyond RM_MAX_BUFS the
 * last one grows to hold the others. */
#define RM_MAX_BUFS 20
struct rm_bufs {
	int n;
	struct {
		uintptr_t p;
		size_t len;
		int write; /* the kernel writes it */
	} b[RM_MAX_BUFS];
};
HIDDEN void rm_bufs_add(struct rm_bufs *bs, uintptr_t p, size_t len, int write);
HIDDEN void rm_bufs_touch(const struct rm_bufs *bs);
HIDDEN void rm_bufs_pin(struct rm_pin *pin, const struct rm_bufs *bs);
/* (the address as a number: glibc's headers say the kernel only writes
 * read's buffer, and the compiler would take the callee for a reader) */
#define rm_add(bs, p, len, write) rm_bufs_add((bs), (uintptr_t)(p), (len), (write))
/* The most a read, write, recv or send hands the kernel in one pinned call (kcall.c,
 * kmisc.c): what is pinned stays resident, so a bigger call goes a chunk at
 * a time, and a budget of a few MiB holds its pins beside the program's
 * other pages (a smaller one bends for pins: the agent lets a fault through
 * when every victim is pinned). */
#define RM_CALL_CHUNK ((size_t)1 << 20)
/* Runs call with bs pinned and present; again while it fails with -1 and
 * EFAULT and retry says it may (three times). */
#define RM_PINNED(bs, retry, call)                                             \
	({                                                                     \
		struct rm_pin pin_;                                            \
		rm_bufs_pin(&pin_, (bs));                                      \
		__typeof__(call) r_;                                           \
		for (int try_ = 0;; try_++) {                                  \
			r_ = (call);                                           \
			if (r_ != (__typeof__(r_))(long)-1 || errno != EFAULT || try_ == 3 || !(retry)) \
				break;                                         \
			rm_bufs_touch(bs);                                     \
		}                                                              \
		rm_pin_end(&pin_);                                             \
		r_;                                                            \
	})
/* The same for calls that return an error number (glibc's pthread_*). */
#define RM_PINNED_ERR(bs, call)                                                \
	({                                                                     \
		struct rm_pin pin_;                                            \
		rm_bufs_pin(&pin_, (bs));                                      \
		int r_;                                                        \
		for (int try_ = 0; (r_ = (call)) == EFAULT && try_ < 3; try_++) \
			rm_bufs_touch(bs);                                     \
		rm_pin_end(&pin_);                                             \
		r_;                                                            \
	})
/* Whether a wrapper's call is the program's, in ring mode. */
static inline int rm_ring_call(void) { return rm_ring_mode && !rm_in_shim(); }

/* ---- ring.c: the fault ring, the shim's side ---- */
HIDDEN int rm_ring_fault(uintptr_t addr, int write); /* signal-safe */
HIDDEN int rm_ring_serve_lost(int uffd);
HIDDEN void rm_ring_atfork_child(void);
HIDDEN void rm_ring_agent_word(int asleep);

/* ---- resume.c ---- */
HIDDEN void rm_resume_loop(void);

/* ---- helper.c ---- */
HIDDEN int rm_helper_start(void);
HIDDEN int rm_helper_running(void);
HIDDEN void rm_helper_atfork_child(void);

/* ---- sigbus.c: the SIGBUS handler and the program's disposition ---- */
HIDDEN int rm_sigbus_install(void);
HIDDEN int rm_sigbus_installed(void);
HIDDEN int rm_sigbus_owned(void);
HIDDEN void rm_sigbus_atfork_child(void);
HIDDEN void rm_sigbus_set(const struct sigaction *act, struct sigaction *old);
HIDDEN int rm_sigaction(int sig, const struct sigaction *act, struct sigaction *old);

/* ---- region.c ---- */
/* How rm_map_fixed* maps over regions. */
#define RM_FIXED_ZAP 1  /* REGION_ZAP first: the contents are gone */
#define RM_FIXED_HEAP 2 /* the heap's range: its regions are not marked R_NOTRW */
HIDDEN void rm_region_open(void);
HIDDEN int rm_region_early(void);
HIDDEN int rm_connected(void);
HIDDEN int rm_region_eligible(int flags);
HIDDEN int rm_shared_memory(int flags, int fd, size_t len, size_t *seg);
HIDDEN void rm_region_unpaged_locked(uintptr_t a, size_t len);
HIDDEN int rm_region_add_locked(void *p, size_t len, int kind, int prot);
HIDDEN int rm_region_punch_locked(uintptr_t a, size_t len);
HIDDEN void rm_region_pending_drop(uintptr_t a, size_t len);
HIDDEN void *rm_map_fixed_locked(uintptr_t a, size_t len, int prot, int flags, int fd, off_t off, int how);
HIDDEN void *rm_map_fixed(void *addr, size_t len, int prot, int flags, int fd, off_t off, int how);
HIDDEN int rm_madvise(void *addr, size_t len, int advice);
HIDDEN int rm_mprotect(void *addr, size_t len, int prot);
HIDDEN int rm_defer_unmap(uintptr_t a, size_t len);
HIDDEN void rm_run_deferred_locked(void);

/* ---- heap.c ---- */
/* The heap's reservation: set once, by rm_heap_reserve. */
HIDDEN extern uintptr_t rm_heap_base;
HIDDEN extern size_t rm_heap_len;
static inline int in_heap(const void *p) { return (uintptr_t)p - rm_heap_base < rm_heap_len; }
HIDDEN int rm_heap_reserve(void);
HIDDEN void rm_heap_prefork(void);
HIDDEN void rm_heap_postfork_parent(void);
HIDDEN void rm_heap_postfork_child(void);
/* The embedded jemalloc, its public names renamed by preload/build.sh. */
HIDDEN void *rm_je_malloc(size_t);
HIDDEN void *rm_je_calloc(size_t, size_t);
HIDDEN void *rm_je_realloc(void *, size_t);
HIDDEN void rm_je_free(void *);
HIDDEN int rm_je_posix_memalign(void **, size_t, size_t);
HIDDEN void *rm_je_memalign(size_t, size_t);
HIDDEN size_t rm_je_malloc_usable_size(void *);
HIDDEN void *rm_je_mallocx(size_t, int);
HIDDEN void *rm_je_rallocx(void *, size_t, int);
#define RM_JE_ZERO 0x40 /* MALLOCX_ZERO */

/* ---- alloc.c ---- */
HIDDEN void rm_enter(void);
HIDDEN void rm_alloc_run_deferred(void);

/* ---- sigwrap.c: SIGBUS never blocked, the program's disposition recorded ---- */
HIDDEN const sigset_t *rm_unbus(const sigset_t *set, sigset_t *buf); /* signal-safe */

/* ---- fork.c ---- */
HIDDEN void rm_fork_register(void);

#endif
