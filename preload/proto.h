/* The shim <-> memagent wire protocol, version 2: the C mirror of the Go
 * package rmem/pager/proto (which is the reference, with the rules in
 * docs/pager.md). One SOCK_SEQPACKET packet per message: a 16-byte
 * little-endian header, then a fixed-layout body; descriptors ride as
 * SCM_RIGHTS. x86-64 and arm64 are little endian, so the structs below are
 * the wire layout (checked by the static asserts). Changes are additive. */
#ifndef RMEM_PROTO_H
#define RMEM_PROTO_H

#include <stdint.h>

#define RMEM_MAGIC 0x4d454d52u /* "RMEM" */
#define RMEM_VERSION 2
#define RMEM_MAX_EVICT_BATCH 128
#define RMEM_NO_SLOT 0xffffffffu /* EVICT entry: drop without copying */
#define RMEM_MAX_ERROR_TEXT 200
#define RMEM_MAX_STAGING_SLOTS (1u << 16)
#define RMEM_MAX_PACKET (16 + 16 + RMEM_MAX_EVICT_BATCH * 16)
#define RMEM_MAX_FDS 3

#define RMEM_DEFAULT_SOCKET "/run/rmem/memagent.sock"
#define RMEM_ENV_SOCKET "RMEM_AGENT_SOCK"
#define RMEM_ENV_MIN_ALLOC "RMEM_MIN_ALLOC"
#define RMEM_ENV_LOCAL_MEM "RMEM_LOCAL_MEM"
#define RMEM_ENV_MAX_SLOWDOWN "RMEM_MAX_SLOWDOWN"
#define RMEM_ENV_IN_THREAD "RMEM_IN_THREAD" /* "1": faults through the fault ring (RMEM_HELLO_RING) */
#define RMEM_ENV_AGENT_WAIT "RMEM_AGENT_WAIT" /* how long to wait for an agent to resume us (resume.c) */
#define RMEM_ENV_UFFD_USER_MODE "RMEM_UFFD_USER_MODE" /* 1: UFFD_USER_MODE_ONLY uffds, for tests (wire.c) */

enum rmem_type {
	RMEM_HELLO = 1,      /* shim -> agent; fd: the uffd (top-level only) */
	RMEM_WELCOME = 2,    /* agent -> shim; fds: staging memfd [, child's uffd] */
	RMEM_REGION_ADD = 3, /* shim -> agent; reply ACK or ERROR */
	RMEM_REGION_DEL = 4, /* shim -> agent; reply ACK or ERROR */
	RMEM_ACK = 5,
	RMEM_ERROR = 6,
	RMEM_EVICT = 7,   /* agent -> shim helper thread */
	RMEM_EVICTED = 8, /* shim -> agent */
	RMEM_REGION_ZAP = 9, /* shim -> agent, body struct rmem_region_del; reply ACK or ERROR */
	RMEM_UFFD_DEVICE = 10, /* shim -> agent before HELLO, no body; reply ACK with /dev/userfaultfd */
	RMEM_FORK_PREPARE = 11, /* shim -> agent, struct rmem_fork (pid 0); reply ACK or ERROR */
	RMEM_FORK_DONE = 12,    /* shim -> agent, struct rmem_fork; no reply */
	RMEM_RESUME_DONE = 13,  /* shim -> agent after a resuming HELLO's REGION_ADDs; reply ACK or ERROR */
	RMEM_HANDOFF = 14,      /* shim -> agent before descriptors leave its sight (exec, SCM_RIGHTS); reply ACK or ERROR */
};

struct rmem_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t seq;
	uint32_t len; /* body bytes */
};

/* The uffd rides along: always for a top-level process (fork_serial 0);
 * for a child forked without FORK events, its own uffd (paired with the
 * parent's FORK_PREPARE by ppid and fork_serial). */
#define RMEM_HELLO_UFFD 1u
/* Resuming: the process lost its agent and says HELLO to the next one,
 * with its uffd and its staging memfd (2 fds), then re-announces its
 * regions (REGION_ADD, RMEM_REGION_RESUMED) and sends RESUME_DONE. */
#define RMEM_HELLO_RESUME 2u
/* The process's faults come through the fault ring (struct rmem_ring): its
 * uffd was made with UFFD_FEATURE_SIGBUS. The agent answers WELCOME with
 * RMEM_WELCOME_RING, or refuses. */
#define RMEM_HELLO_RING 4u
/* The sender is the shim: it announces every mapping of shared memory it
 * makes (KIND_SHARED), so the agent lets it open the segments it pages. */
#define RMEM_HELLO_SHARED 16u
struct rmem_hello {
	int32_t pid;
	int32_t ppid;
	uint64_t fork_serial; /* 0 top-level, N: the parent's Nth fork with regions */
	uint64_t features;    /* UFFD_FEATURE_* enabled on the uffd */
	uint32_t page_size;
	uint32_t flags;
	uint64_t local_mem; /* resident budget asked for (RMEM_LOCAL_MEM); 0: the agent's */
	uint32_t max_slowdown; /* stall to steer the budget by, millionths (RMEM_MAX_SLOWDOWN); 0: the agent's */
	uint32_t reserved;
};

#define RMEM_WELCOME_UFFD 1u    /* second fd: the forked child's own uffd */
#define RMEM_WELCOME_RESUMED 2u /* the agent has the journal of this process's pages */
/* The staging memfd holds the fault ring after its staging slots (at
 * staging_slots pages); the doorbell eventfd rides as the last fd. */
#define RMEM_WELCOME_RING 4u
struct rmem_welcome {
	uint64_t client_id;
	uint64_t min_alloc;
	uint32_t staging_slots; /* 1..RMEM_MAX_STAGING_SLOTS pages */
	uint32_t flags;
};

enum rmem_kind { RMEM_KIND_HEAP = 1, RMEM_KIND_MMAP = 2, RMEM_KIND_SHARED = 3 };

struct rmem_region_add {
	uint64_t id;
	uint64_t start;
	uint64_t len;
	uint32_t kind;
	uint32_t flags; /* RMEM_REGION_RESUMED, RMEM_REGION_UNPAGED */
};

/* A region re-announced after a resuming HELLO: registered already, its
 * pages resident, in the pool or staged. */
#define RMEM_REGION_RESUMED 1u
/* A mapping of shared memory the shim maps but does not page (its uffd
 * refused to register it, or MAP_LOCKED): never a region; the agent stops
 * paging the segment if it does, and refuses it (KIND_SHARED only). */
#define RMEM_REGION_UNPAGED 2u

struct rmem_resume_done {
	uint32_t regions;  /* REGION_ADDs sent before it */
	uint32_t reserved; /* 0 */
};

/* HANDOFF: descriptors of pid (the sender, or its vfork child about to
 * exec) are about to leave the agent's sight, to a new program or over a
 * socket; the agent releases the shared memory segments it pages that
 * they reach (answering EPERM if one has pages the pool lost). */
#define RMEM_HANDOFF_MAX_FDS 16
/* pid is about to exec: every descriptor it keeps across it leaves too. */
#define RMEM_HANDOFF_EXEC 1u
/* pid is about to read or write the file through fds (read(2), write(2)). */
#define RMEM_HANDOFF_IO 2u
struct rmem_handoff {
	int32_t pid;
	uint32_t flags;
	uint32_t n; /* fds[:n] are named, the rest 0 */
	uint32_t reserved;
	int32_t fds[RMEM_HANDOFF_MAX_FDS];
};

struct rmem_region_del {
	uint64_t id;
	uint64_t start;
	uint64_t len;
};

struct rmem_ack {
	uint32_t seq; /* the request's */
	uint32_t reserved;
};

struct rmem_error {
	uint32_t seq;
	uint32_t err; /* errno, nonzero */
	char text[RMEM_MAX_ERROR_TEXT]; /* len - 8 bytes used, not NUL-terminated */
};

struct rmem_evict_page {
	uint64_t addr;
	uint32_t slot; /* staging slot, or RMEM_NO_SLOT: drop only */
	uint32_t reserved;
};

struct rmem_evict {
	uint64_t batch;
	uint32_t n; /* 1..RMEM_MAX_EVICT_BATCH */
	uint32_t reserved;
	struct rmem_evict_page pages[RMEM_MAX_EVICT_BATCH];
};

struct rmem_evicted {
	uint64_t batch;
	uint32_t done;
	uint32_t err; /* errno of the first page not done */
};

/* FORK_PREPARE (pid 0) and FORK_DONE (the child's pid, -errno, or 0: not
 * known, a fork inside the C library seen by an atfork handler). */
struct rmem_fork {
	uint64_t serial; /* nonzero */
	int32_t pid;
	uint32_t reserved; /* 0 */
};

/* The fault ring (pager/proto/ring.go has the protocol): one page of the
 * staging memfd shared with the agent. A faulting thread claims a FREE
 * entry, fills it in, stores POSTED, rings the doorbell if the agent is
 * ASLEEP, waits (polls, then FUTEX_WAIT on state with waiters set: a
 * shared futex), reads the result and stores FREE. */
#define RMEM_RING_SIZE 4096
#define RMEM_RING_ENTRIES 63
#define RMEM_RING_MAGIC 0x474e4952u /* "RING" */
enum rmem_ring_agent { RMEM_RING_AWAKE = 0, RMEM_RING_ASLEEP = 1 };
enum rmem_ring_state {
	RMEM_RING_FREE = 0,
	RMEM_RING_CLAIMED = 1,
	RMEM_RING_POSTED = 2,
	RMEM_RING_SERVING = 3,
	RMEM_RING_DONE = 4,     /* served: retry the access */
	RMEM_RING_LOST = 5,     /* the page is lost (poisoned) */
	RMEM_RING_NOT_MINE = 6, /* not a fault in one of the process's regions */
};
#define RMEM_RING_WRITE 1u /* the access that faulted was a write */
struct rmem_ring_entry {
	uint32_t state;   /* enum rmem_ring_state; a futex word */
	uint32_t waiters; /* nonzero while a thread sleeps on state */
	uint32_t tid;
	uint32_t flags;  /* RMEM_RING_WRITE */
	uint64_t addr;   /* the faulting address */
	uint64_t posted; /* CLOCK_MONOTONIC ns at the post */
	uint8_t pad[32];
};
struct rmem_ring {
	uint32_t magic;   /* RMEM_RING_MAGIC, written by the agent */
	uint32_t entries; /* RMEM_RING_ENTRIES */
	uint32_t agent;   /* enum rmem_ring_agent, the agent's */
	uint32_t reserved;
	uint64_t posted;    /* faults posted (threads add 1) */
	uint64_t doorbells; /* doorbells rung (threads add 1) */
	uint8_t pad[32];
	struct rmem_ring_entry e[RMEM_RING_ENTRIES];
};

_Static_assert(sizeof(struct rmem_ring_entry) == 64, "ring entry layout");
_Static_assert(sizeof(struct rmem_ring) == RMEM_RING_SIZE, "ring layout");
_Static_assert(sizeof(struct rmem_hdr) == 16, "header layout");
_Static_assert(sizeof(struct rmem_fork) == 16, "FORK layout");
_Static_assert(sizeof(struct rmem_hello) == 48, "HELLO layout");
_Static_assert(sizeof(struct rmem_welcome) == 24, "WELCOME layout");
_Static_assert(sizeof(struct rmem_region_add) == 32, "REGION_ADD layout");
_Static_assert(sizeof(struct rmem_region_del) == 24, "REGION_DEL layout");
_Static_assert(sizeof(struct rmem_resume_done) == 8, "RESUME_DONE layout");
_Static_assert(sizeof(struct rmem_ack) == 8, "ACK layout");
_Static_assert(sizeof(struct rmem_evict_page) == 16, "EVICT entry layout");
_Static_assert(sizeof(struct rmem_evict) == 16 + RMEM_MAX_EVICT_BATCH * 16, "EVICT layout");
_Static_assert(sizeof(struct rmem_evicted) == 16, "EVICTED layout");
_Static_assert(16 + sizeof(struct rmem_evict) == RMEM_MAX_PACKET, "max packet");

#endif
