/* librmem.so internals: the one header of the shim's files (what the shim
 * does and why: ../doc.go and docs/pager.md).
 *
 *   util.c       configuration, say(), raw system calls
 *   table.c      the region table and the requests that change it
 *   conn.c       the connection: packets, userfaultfd, handshake
 *   helper.c     the helper thread: replies and EVICT
 *   alloc.c      the mode, the malloc family, the constructor
 *   heap.c       glibc mode's heap: the embedded jemalloc's memory
 *   interpose.c  mmap, munmap, mremap, madvise, mprotect, sbrk
 *   fork.c       fork
 *
 * Locks, in this order (a thread holding one takes only later ones):
 *
 *   fork_mu    a fork in progress: from our atfork prepare handler to
 *              the end of the fork (fork.c)
 *   allocator  the embedded jemalloc's locks (glibc mode; fork.c calls
 *              its fork handlers), or a foreign allocator's, which hold
 *              them when they call our mmap, munmap, madvise or sbrk
 *   mode_mu    deciding the mode (alloc.c)
 *   init_mu    the connection state
 *   req_mu     one request to the agent at a time; only its holder
 *              changes the region table's layout
 *   heap_mu    the heap's bump pointer (leaf)
 *   table_mu   the region table and the pending list
 *   reply_mu   the hand-over of replies from the helper thread
 *
 * The helper thread takes only table_mu and reply_mu, and nothing it does
 * under them touches paged memory except the resident victims it copies:
 * shim state lives in .bss, never in a region (a fault there would wait
 * for an agent that waits for the helper).
 *
 * Nothing here may allocate through the shim. Shim code runs with the
 * per-thread guard in_shim set: its allocations (by libc functions it
 * calls, dlsym, pthread_create) go to glibc in glibc mode and to the
 * foreign allocator in foreign mode, and its mmaps are raw. Code that can
 * run inside another allocator's mmap call (the whole mmap, munmap,
 * madvise and sbrk paths, the handshake) allocates nothing at all.
 */
#ifndef RMEM_H
#define RMEM_H

#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

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

/* ST_RESUMING: the agent went away and the helper looks for the next one
 * (resume.c): requests wait. ST_ORPHANED: none came in time: requests fail,
 * faults get SIGBUS, the helper still looks. */
enum state { ST_UNINIT, ST_CONNECTED, ST_OFF, ST_RESUMING, ST_ORPHANED };
enum kind { KIND_HEAP = RMEM_KIND_HEAP, KIND_MMAP = RMEM_KIND_MMAP };

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

/* The mode (alloc.c). */
enum mode {
	MODE_UNKNOWN, /* not decided yet */
	MODE_GLIBC,   /* the shim is the allocator: the embedded jemalloc */
	MODE_FOREIGN, /* another allocator: every malloc call goes to it */
	MODE_LIBC,    /* glibc mode without a heap (no reservation): glibc */
	MODE_LOST,    /* a child forked past fork(3) that lost its heap */
};

/* ---- util.c ---- */
HIDDEN extern size_t g_page;
HIDDEN extern size_t g_min_alloc;
HIDDEN extern int g_min_from_env;
HIDDEN extern uint64_t g_local_mem;
HIDDEN extern char g_sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
HIDDEN extern pid_t (*real_fork)(void);
HIDDEN extern void *(*real_sbrk)(intptr_t);
HIDDEN void init_config(void);
HIDDEN void say(const char *first, ...);
HIDDEN const char *errstr(int err);
HIDDEN void *raw_mmap(void *a, size_t len, int prot, int flags, int fd, off_t off);
HIDDEN int raw_munmap(void *a, size_t len);
HIDDEN int raw_madvise(void *a, size_t len, int advice);
HIDDEN int raw_mprotect(void *a, size_t len, int prot);
HIDDEN size_t parse_size(const char *s, int *ok);

static inline size_t round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }
static inline int add_overflows(size_t a, size_t b) { return a + b < a; }
/* Whether [a, a+len) is a page-aligned, non-empty range that does not
 * wrap once len is rounded up to pages. */
static inline int page_range(uintptr_t a, size_t len)
{
	return !(a & (g_page - 1)) && len && !add_overflows(a, round_up(len, g_page));
}

/* ---- table.c ---- */
HIDDEN extern struct region g_regions[MAX_REGIONS]; /* sorted by base; table_mu */
HIDDEN extern int g_nregions;                        /* atomic loads */
HIDDEN extern pthread_mutex_t table_mu;
HIDDEN int table_covers_locked(uintptr_t a, size_t len);
HIDDEN int overlaps_regions(uintptr_t a, size_t len);
HIDDEN void table_mark(uintptr_t a, size_t len, int flags);
HIDDEN int add_region_locked(void *p, size_t len, int kind, int prot);
HIDDEN int punch_locked(uintptr_t a, size_t len);
HIDDEN void zap_locked(uintptr_t a, size_t len);
HIDDEN int next_piece(uintptr_t at, uintptr_t end, struct region *r, uintptr_t *lo, uintptr_t *hi);
HIDDEN int register_all(int fd, uint64_t mode);
HIDDEN void fork_advice_locked(int advice);
HIDDEN void pending_add(uintptr_t a, size_t len, int kind, int prot);
HIDDEN void pending_drop(uintptr_t a, size_t len);
HIDDEN int pending_count(void);
HIDDEN void pending_register(void);

/* ---- conn.c ---- */
HIDDEN extern int g_state; /* atomic loads; changed under init_mu */
HIDDEN extern pid_t g_pid; /* the process that made the connection */
HIDDEN extern int g_uffd;  /* our own reference: a dead agent blocks, never zeros */
HIDDEN extern int g_sock;
HIDDEN extern int g_mem_fd; /* /proc/self/mem of g_pid, for R_UNREADABLE victims */
HIDDEN extern char *g_staging;
HIDDEN extern int g_staging_fd; /* kept: a resuming HELLO hands it to the next agent */
HIDDEN extern uint32_t g_slots;
HIDDEN extern uint64_t g_features;
HIDDEN extern uint64_t g_fork_serial;
HIDDEN extern uint32_t g_seq;
HIDDEN extern uint64_t g_next_id;
HIDDEN extern pthread_mutex_t init_mu, req_mu, reply_mu;
HIDDEN extern pthread_cond_t reply_cv;
struct reply {
	uint32_t seq;
	int done;
	int err;  /* 0: ACK, else ERROR's errno or EPIPE */
	int dead; /* the connection is gone */
};
HIDDEN extern struct reply g_reply; /* reply_mu */
enum hs {
	HS_TOP,        /* top-level: makes its uffd, sends it */
	HS_FORK_EVENT, /* child of a FORK event: the agent sends it its uffd */
	HS_FORK_OWN,   /* child of a fork without FORK events: makes a uffd,
			  registers the regions with it, sends it */
};
HIDDEN int send_packet(uint16_t type, uint32_t seq, const void *body, uint32_t len, int fd);
HIDDEN int send_packet_fds(uint16_t type, uint32_t seq, const void *body, uint32_t len, const int *fds, int nfds);
HIDDEN int recv_packet(int sock, void *buf, struct rmem_hdr *h, int *fds, int *nfds);
HIDDEN int request_locked(uint16_t type, const void *body, uint32_t len);
HIDDEN void deliver_reply(uint32_t seq, int err);
HIDDEN void lost_agent(int err);
HIDDEN int uffd_with(uint64_t features);
HIDDEN int handshake(enum hs mode, const char **why);
HIDDEN void say_off(const char *why, int err);
HIDDEN int connected(void);
HIDDEN int is_connected(void);
HIDDEN void req_lock(void);
HIDDEN void req_unlock(void);

/* ---- resume.c ---- */
HIDDEN void wait_resumed(void);
HIDDEN void resume_loop(void);

/* ---- helper.c ---- */
HIDDEN extern sem_t g_conn_sem;
HIDDEN extern int g_helper_exists;
HIDDEN int start_helper(void);

/* ---- alloc.c ---- */
HIDDEN extern TLS int in_shim;
HIDDEN extern TLS int in_fork; /* between our fork prepare and parent/child handlers */
HIDDEN extern TLS int t_boot;  /* this thread's allocations come from the bootstrap arena */
HIDDEN extern int g_ctor_done; /* mmaps before our constructor are registered by it */
HIDDEN extern int g_mode;      /* the mode decided (atomic loads) */
HIDDEN void enter(void);
HIDDEN void alloc_fork_child(int lost_heap);
HIDDEN void alloc_run_deferred(void);

/* ---- heap.c ---- */
HIDDEN extern uintptr_t g_res_base; /* the heap's reservation (set once) */
HIDDEN extern size_t g_res_len;
static inline int in_heap(const void *p) { return (uintptr_t)p - g_res_base < g_res_len; }
HIDDEN int heap_reserve(void);
HIDDEN void heap_prefork(void);
HIDDEN void heap_postfork_parent(void);
HIDDEN void heap_postfork_child(void);
/* The embedded jemalloc, its public names renamed by preload/build.sh. */
HIDDEN void *rmem_je_malloc(size_t);
HIDDEN void *rmem_je_calloc(size_t, size_t);
HIDDEN void *rmem_je_realloc(void *, size_t);
HIDDEN void rmem_je_free(void *);
HIDDEN int rmem_je_posix_memalign(void **, size_t, size_t);
HIDDEN void *rmem_je_memalign(size_t, size_t);
HIDDEN size_t rmem_je_malloc_usable_size(void *);
HIDDEN void *rmem_je_mallocx(size_t, int);
HIDDEN void *rmem_je_rallocx(void *, size_t, int);
#define RMEM_JE_ZERO 0x40 /* MALLOCX_ZERO */

/* ---- interpose.c ---- */
HIDDEN int madvise_core(void *addr, size_t len, int advice);
HIDDEN int mprotect_core(void *addr, size_t len, int prot);
HIDDEN void *mmap_fixed_over_regions(void *addr, size_t len, int prot, int flags, int fd, off_t off);
HIDDEN void *fixed_locked(uintptr_t a, size_t len, int prot, int flags, int fd, off_t off, int zap);
HIDDEN int defer_unmap(uintptr_t a, size_t len);
HIDDEN void run_deferred_locked(void);

/* ---- fork.c ---- */
HIDDEN void fork_register(void);
HIDDEN void astray_child(void);
HIDDEN void child_lost_pages(const char *why, int err);

#endif
