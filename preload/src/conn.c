/* The connection to memagent: the process's state towards its agent (one
 * struct, this file its only writer), the transitions that change it, and
 * the requests program threads make (one at a time, req_mu; the helper
 * thread hands them their reply). Nothing here allocates: it runs inside
 * other allocators' mmap calls.
 *
 * The state and its transitions (each a function below):
 *
 *   UNINIT     --connect-->   CONNECTED, or OFF (no agent, refused)
 *   CONNECTED  --lost-->      RESUMING (a process with regions), or OFF
 *   RESUMING   --resume-->    CONNECTED;  --orphan--> ORPHANED
 *   ORPHANED   --resume-->    CONNECTED
 *   any        --astray-->    OFF (a child forked past fork(3))
 *   in a fork(3) child (fork-adopt), from the state at the fork:
 *   CONNECTED --> CONNECTED (its own connection) or, without regions,
 *   UNINIT (starts over); UNINIT --> UNINIT; ORPHANED or OFF --> OFF
 *   (lost: with the regions guarded or fenced); anything --> OFF when it
 *   cannot start a helper thread it needs.
 *
 * A child never keeps its parent's socket, uffd, staging area or
 * /proc/self/mem, whatever the state: a uffd's ioctls act on the address
 * space of the process that made it, so a child unregistering a region
 * through its parent's uffd unregistered it in the parent, whose pooled
 * pages then read as zeros.
 *
 * Locks: init_mu (connect, the fork window), then req_mu (one request at
 * a time; held across a fork), then the region table's table_mu, then
 * reply_mu (the reply slot, and the state's waiters: changes to and from
 * RESUMING and ORPHANED are made under it and broadcast, and so are the
 * resume attempts and lost forks that keep each other out). The state is
 * stored with atomics and read without locks: rm_conn_state, rm_conn_uffd,
 * rm_conn_staging and rm_conn_slots are safe in a signal handler. */
#include "rmem.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <semaphore.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static struct {
	int state;      /* enum state: atomic loads, stored by set_state only */
	pid_t pid;      /* the process that made the connection */
	int sock;       /* read by the helper thread only, but for sends */
	int uffd;       /* our own reference: a dead agent blocks, never zeros */
	int mem_fd;     /* /proc/self/mem of pid, for R_UNREADABLE victims */
	int staging_fd; /* kept: a resuming HELLO hands it to the next agent */
	char *staging;
	uint32_t slots;
	struct rmem_ring *ring; /* ring mode: the fault ring (atomic) */
	int doorbell;           /* ring mode: the agent's eventfd, -1 (atomic) */
	uint64_t features;
	uint64_t fork_serial; /* forks with regions: FORK events, or FORK_PREPAREs */
	int lost_said;
	int resuming;    /* the helper tries an agent (reply_mu) */
	int lost_fork;   /* a lost fork's child inherits the regions (reply_mu): no resume attempt */
	int fork_events; /* lost forks' FORK events the helper has yet to read (atomic) */
	pthread_mutex_t init_mu;
	pthread_mutex_t req_mu;
	sem_t ready; /* a new connection for the helper to serve */
	pthread_mutex_t reply_mu;
	pthread_cond_t reply_cv;
	struct {
		uint32_t seq;
		int done;
		int err;  /* 0: ACK, else ERROR's errno or EPIPE */
		int dead; /* the connection is gone */
	} reply; /* reply_mu */
} conn = {
	.state = ST_UNINIT,
	.sock = -1,
	.uffd = -1,
	.mem_fd = -1,
	.staging_fd = -1,
	.doorbell = -1,
	.init_mu = PTHREAD_MUTEX_INITIALIZER,
	.req_mu = PTHREAD_MUTEX_INITIALIZER,
	.reply_mu = PTHREAD_MUTEX_INITIALIZER,
	.reply_cv = PTHREAD_COND_INITIALIZER,
};

static void set_state(int st) { __atomic_store_n(&conn.state, st, __ATOMIC_RELEASE); }

/* A change waiters may wait for (rm_conn_wait_resumed, requests). Preconditions:
 * reply_mu held. */
static void set_state_locked(int st)
{
	set_state(st);
	pthread_cond_broadcast(&conn.reply_cv);
}

static void set_uffd(int fd) { __atomic_store_n(&conn.uffd, fd, __ATOMIC_RELEASE); }

/* Whether this process posts its faults to a fault ring (declared in
 * rmem.h for the wrappers' fast path): conn.ring is set. */
int rm_ring_mode;

static void set_ring(struct rmem_ring *r, int doorbell)
{
	__atomic_store_n(&conn.doorbell, doorbell, __ATOMIC_RELEASE);
	__atomic_store_n(&conn.ring, r, __ATOMIC_RELEASE);
	__atomic_store_n(&rm_ring_mode, r != NULL, __ATOMIC_RELEASE);
}

/* Called once, by our constructor, before the helper thread starts. */
void rm_conn_init(void) { sem_init(&conn.ready, 0, 0); }

/* ---- accessors ---- */

int rm_conn_state(void) { return __atomic_load_n(&conn.state, __ATOMIC_ACQUIRE); }
int rm_conn_uffd(void) { return __atomic_load_n(&conn.uffd, __ATOMIC_ACQUIRE); }
char *rm_conn_staging(void) { return __atomic_load_n(&conn.staging, __ATOMIC_ACQUIRE); }
uint32_t rm_conn_slots(void) { return __atomic_load_n(&conn.slots, __ATOMIC_ACQUIRE); }
struct rmem_ring *rm_conn_ring(void) { return __atomic_load_n(&conn.ring, __ATOMIC_ACQUIRE); }
int rm_conn_doorbell(void) { return __atomic_load_n(&conn.doorbell, __ATOMIC_ACQUIRE); }
pid_t rm_conn_pid(void) { return __atomic_load_n(&conn.pid, __ATOMIC_ACQUIRE); }
int rm_conn_sock(void) { return conn.sock; }
int rm_conn_mem_fd(void) { return conn.mem_fd; }

/* Whether this process may talk to the agent. A child made past fork(3)
 * and its atfork handlers (_Fork(), a raw clone) inherited its parent's
 * connection and uffd: it drops them at once (rm_conn_astray). A fork(3)
 * child before our atfork child handler ran (in_fork) has the parent's
 * too, and drops them in that handler. A child that shares its parent's
 * memory (vfork's, before it execs) leaves them alone: they are its
 * parent's, in that memory (rm_mode_astray tells it apart). */
int rm_conn_is_connected(void)
{
	if (rm_conn_state() != ST_CONNECTED)
		return 0;
	if (getpid() == conn.pid)
		return 1;
	if (!rm_in_fork() && rm_mode_astray() != 0)
		rm_conn_astray();
	return 0;
}

/* The helper thread: waits for a connection to serve; returns its socket. */
int rm_conn_await(void)
{
	while (rm_sem_wait(&conn.ready) != 0)
		;
	return conn.sock;
}

/* Blocks while the helper looks for the next agent (ST_RESUMING).
 * Preconditions: reply_mu not held. */
void rm_conn_wait_resumed(void)
{
	if (rm_conn_state() != ST_RESUMING)
		return;
	rm_lock(&conn.reply_mu);
	while (conn.state == ST_RESUMING)
		rm_cond_wait(&conn.reply_cv, &conn.reply_mu);
	pthread_mutex_unlock(&conn.reply_mu);
}

/* ---- transitions ---- */

static void say_off(const char *why, int err)
{
	if (why)
		rm_say("rmem: ", why, " (", rm_errstr(err), "): using ordinary memory", NULL);
	else
		rm_say("rmem: no agent at ", rm_sock_path(), " (", rm_errstr(err), "): using ordinary memory", NULL);
}

/* Drops what a child inherited of its parent's connection: its socket,
 * its uffd (ioctls on it act on the parent's address space), its staging
 * memfd and fault ring (the mapping is MADV_DONTFORK: wire.c; the parent's
 * ring is never the child's), the doorbell and /proc/self/mem (the
 * parent's memory). The only thread. */
static void drop_inherited(void)
{
	int fd = rm_conn_uffd(), db = rm_conn_doorbell();
	set_uffd(-1);
	set_ring(NULL, -1);
	__atomic_store_n(&conn.staging, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&conn.slots, 0, __ATOMIC_RELEASE);
	if (fd >= 0)
		close(fd);
	if (db >= 0)
		close(db);
	int *fds[] = {&conn.sock, &conn.staging_fd, &conn.mem_fd};
	for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

/* Makes a handshake's session the process's connection, and hands it to
 * the helper thread. Preconditions: init_mu held, or the only thread. */
static void adopt(const struct rm_session *s)
{
	conn.sock = s->sock;
	set_uffd(s->uffd);
	__atomic_store_n(&conn.staging, s->staging, __ATOMIC_RELEASE);
	__atomic_store_n(&conn.slots, s->slots, __ATOMIC_RELEASE);
	if (conn.staging_fd >= 0)
		close(conn.staging_fd);
	conn.staging_fd = s->staging_fd;
	conn.features = s->features;
	set_ring(s->ring, s->doorbell);
	rm_offer_min_alloc(s->min_alloc);
	memset(&conn.reply, 0, sizeof conn.reply);
	if (conn.mem_fd >= 0)
		close(conn.mem_fd); /* a fork child's: it names the parent's memory */
	conn.mem_fd = (int)rm_sysret(rm_sys(SYS_openat, AT_FDCWD, "/proc/self/mem", O_RDONLY | O_CLOEXEC));
	conn.pid = getpid();
}

/* connect: UNINIT -> CONNECTED or OFF, once (the first caller makes the
 * handshake, the others wait on init_mu). Returns whether connected, and
 * *now when this call connected. Preconditions: in_shim set, req_mu not
 * held, the helper thread started. */
int rm_conn_connect(int *now)
{
	*now = 0;
	rm_lock(&conn.init_mu);
	if (conn.state == ST_UNINIT) {
		struct rm_session s;
		const char *why = NULL;
		int err = rm_hello_top(&s, &why);
		if (err) {
			say_off(why, -err);
			set_state(ST_OFF);
		} else {
			adopt(&s);
			set_state(ST_CONNECTED);
			sem_post(&conn.ready);
			*now = 1;
		}
	}
	int st = conn.state;
	pthread_mutex_unlock(&conn.init_mu);
	return st == ST_CONNECTED;
}

/* lost: the connection is gone (the helper thread saw it end): wake the
 * requester, say so once. Memory the agent paged out stays out: its faults
 * wait (we hold the uffd). A process with regions looks for the next agent
 * to resume it (the helper, in resume.c); requests wait for that. A
 * malformed packet is not an agent that went away: no resuming then. */
void rm_conn_lost(int err)
{
	int resume = err != EPROTO && getpid() == conn.pid && rm_table_count() > 0 &&
		     rm_conn_state() == ST_CONNECTED;
	rm_lock(&conn.reply_mu);
	conn.reply.dead = 1;
	set_state_locked(resume ? ST_RESUMING : ST_OFF);
	pthread_mutex_unlock(&conn.reply_mu);
	if (!__atomic_exchange_n(&conn.lost_said, 1, __ATOMIC_ACQ_REL)) {
		if (resume)
			rm_say("rmem: lost the agent (", rm_errstr(err),
			       "): waiting for an agent to resume this process; meanwhile faults on paged-out memory wait",
			       NULL);
		else
			rm_say("rmem: lost the agent (", rm_errstr(err),
			       "): new allocations use ordinary memory; paged-out memory waits for an agent", NULL);
	}
}

/* resume: one try at the next agent (RESUMING or ORPHANED -> CONNECTED).
 * The uffd, the staging area and the regions stay; the socket is new.
 * Returns 0, *journaled set when the agent had this process's journal, or
 * -errno. Preconditions: the helper thread (resume.c), which alone uses
 * the socket meanwhile: program threads wait for the state to change. */
int rm_conn_resume(int *journaled)
{
	/* Not while a lost fork's child inherits the regions: the next agent
	 * would take the uffd, and the fork's FORK event with it (resume.c
	 * closes it). Such a fork waits for an attempt in progress. */
	rm_lock(&conn.reply_mu);
	int busy = conn.lost_fork;
	conn.resuming = !busy;
	pthread_mutex_unlock(&conn.reply_mu);
	if (busy)
		return -EBUSY;
	struct rm_session cur = {
		.uffd = conn.uffd, .staging_fd = conn.staging_fd, .slots = conn.slots, .features = conn.features,
	};
	int db = -1;
	int s = rm_hello_resume(&cur, journaled, &db);
	if (s >= 0) {
		int old = conn.sock;
		conn.sock = s;
		if (old >= 0)
			close(old);
	}
	if (db >= 0) {
		/* The next agent's doorbell takes the old one's number: a
		 * faulting thread may be writing to that number right now. */
		int cur_db = rm_conn_doorbell();
		if (cur_db < 0)
			__atomic_store_n(&conn.doorbell, db, __ATOMIC_RELEASE);
		else if (rm_sys(SYS_dup3, db, cur_db, O_CLOEXEC) >= 0)
			close(db);
		/* The next agent serves the ring from its WELCOME on, and may
		 * have said ASLEEP already: a thread that posted meanwhile rang
		 * the old agent's eventfd, still under that number until the
		 * dup3, and would wait for good (and the agent with it). One
		 * ring on the new one makes the agent look at the ring. */
		uint64_t one = 1;
		rm_sys(SYS_write, rm_conn_doorbell(), &one, sizeof one);
	}
	rm_lock(&conn.reply_mu);
	conn.resuming = 0;
	if (s >= 0) {
		memset(&conn.reply, 0, sizeof conn.reply);
		set_state_locked(ST_CONNECTED);
	} else {
		pthread_cond_broadcast(&conn.reply_cv);
	}
	pthread_mutex_unlock(&conn.reply_mu);
	return s < 0 ? s : 0;
}

/* orphan: RESUMING -> ORPHANED, no agent came in time: requests fail. */
void rm_conn_orphan(void)
{
	rm_lock(&conn.reply_mu);
	set_state_locked(ST_ORPHANED);
	pthread_mutex_unlock(&conn.reply_mu);
}

/* astray: a child made past fork(3) and its atfork handlers (_Fork(), a
 * raw clone), noticed at its first call into the shim: its mode page reads
 * MODE_UNKNOWN (mode.c) or its pid is not the connected one. It did not
 * inherit the regions (MADV_DONTFORK): their addresses are reserved
 * inaccessible (rm_table_fence), so that touching one raises SIGSEGV. It
 * drops its parent's connection and uffd, whatever their state (using them
 * would unregister memory in the parent's address space and speak for it)
 * and uses ordinary memory from now on; in glibc mode, without its heap if
 * the heap had regions. The only thread: no locks (they may have been held
 * when it was forked). */
void rm_conn_astray(void)
{
	static pid_t done;
	pid_t me = getpid();
	if (done != me) {
		done = me;
		set_state(ST_OFF); /* (no helper thread: it could not connect) */
		drop_inherited();
		conn.pid = me;
		if (rm_table_count() > 0) {
			rm_table_fence();
			rm_say("rmem: this process was forked without fork(3) (_Fork(), a raw clone): it did not inherit"
			       " its parent's paged memory (touching it raises SIGSEGV) and uses ordinary memory from now"
			       " on", NULL);
		}
	}
	rm_mode_fork_child(rm_table_has_heap());
}

/* How the child of a fork in a process that lost its agent (state st:
 * ORPHANED, OFF) but holds regions gets them. Their pooled pages are lost
 * to it as to its parent: it inherits the regions and registers them with
 * a uffd of its own that raises SIGBUS on a missing page (RM_LOST_GUARD),
 * when it can. Without FORK events it can: the kernel drops the parent's
 * registration in the child. With them, copying a registered vma raises a
 * FORK event, fork(2) waits until it is read, and the child's regions are
 * registered with the FORK uffd its reader gets: it can when ORPHANED,
 * where the helper reads the uffd and closes a lost fork's FORK uffd
 * (resume.c; the child's registration goes with it, and the child's own
 * takes its place). Not when OFF (a malformed packet: the agent, never
 * told, may still read the uffd, and keep the child's FORK uffd), nor
 * without a uffd of ours (a child whose HELLO failed, whose FORK uffd an
 * agent may hold): there the regions stay MADV_DONTFORK and the child does
 * not inherit them (RM_LOST_FENCE): no FORK event, no reader to wait for.
 * Preconditions: req_mu held. */
static int lost_kind(int st)
{
	if (rm_conn_uffd() < 0)
		return RM_LOST_FENCE;
	if (!(conn.features & UFFD_FEATURE_EVENT_FORK) || st == ST_ORPHANED)
		return RM_LOST_GUARD;
	return RM_LOST_FENCE;
}

/* fork, prepare (our atfork prepare handler): takes init_mu and req_mu,
 * held across fork(2) (rm_conn_fork_parent releases them; the child makes
 * new ones), so that no request is in flight and the FORK event, the fork
 * serial and the child agree; counts a fork with regions and, without FORK
 * events, has the agent copy the page table for the child (FORK_PREPARE).
 * A fork while the agent is lost (orphaned, off) is not counted: see
 * lost_kind. wrapper: our fork() is the caller (it reports a refusal
 * itself). Preconditions: fork_mu held, rm_conn_wait_resumed done (a
 * resume that began since is waited for here). */
void rm_conn_fork_prepare(struct rm_fork *f, int wrapper)
{
	rm_lock(&conn.init_mu);
	rm_lock(&conn.req_mu);
	int mine = getpid() == conn.pid && rm_table_count() > 0;
	rm_lock(&conn.reply_mu);
	while (conn.state == ST_RESUMING || conn.resuming)
		rm_cond_wait(&conn.reply_cv, &conn.reply_mu);
	f->state = conn.state;
	f->had_regions = f->state == ST_CONNECTED && mine;
	f->lost = mine && (f->state == ST_ORPHANED || f->state == ST_OFF) ? lost_kind(f->state) : 0;
	f->inherit = f->had_regions || f->lost == RM_LOST_GUARD;
	if (f->lost == RM_LOST_GUARD && (conn.features & UFFD_FEATURE_EVENT_FORK)) {
		conn.lost_fork = 1; /* until rm_conn_fork_parent */
		__atomic_add_fetch(&conn.fork_events, 1, __ATOMIC_ACQ_REL);
	}
	pthread_mutex_unlock(&conn.reply_mu);
	f->own = f->had_regions && !(conn.features & UFFD_FEATURE_EVENT_FORK);
	f->prepared = f->refused = 0;
	if (f->had_regions)
		conn.fork_serial++;
	f->serial = conn.fork_serial;
	if (f->own) {
		struct rmem_fork m = {.serial = conn.fork_serial};
		rm_shim_enter();
		int err = rm_request_locked(RMEM_FORK_PREPARE, &m, sizeof m);
		if (err && !wrapper)
			rm_say("rmem: the agent cannot keep this process's pooled pages for a child forked inside the C"
			       " library (daemon()): the child gets SIGBUS on them", NULL);
		rm_shim_leave();
		f->prepared = !err;
		f->refused = err;
	}
}

/* fork, in the parent (our atfork parent handler): FORK_DONE for a fork
 * the wrapper does not see (inside the C library: pid unknown), then
 * req_mu and init_mu go. */
void rm_conn_fork_parent(const struct rm_fork *f, int wrapper)
{
	if (f->prepared && !wrapper) {
		struct rmem_fork m = {.serial = f->serial, .pid = 0}; /* not known here */
		rm_send(conn.sock, RMEM_FORK_DONE, rm_next_seq(), &m, sizeof m, -1);
	}
	if (f->lost) { /* its FORK event, if any, was read: the helper may resume */
		rm_lock(&conn.reply_mu);
		conn.lost_fork = 0;
		pthread_mutex_unlock(&conn.reply_mu);
	}
	pthread_mutex_unlock(&conn.req_mu);
	pthread_mutex_unlock(&conn.init_mu);
}

/* fork, done (our fork() wrapper, in the parent): FORK_DONE with the
 * child's pid or fork(2)'s errno; a failed fork with FORK events is not
 * counted (most failures come before the event). Preconditions: in_shim
 * set, req_mu not held. */
void rm_conn_fork_done(const struct rm_fork *f, pid_t pid, int err)
{
	rm_lock(&conn.req_mu);
	if (f->prepared && rm_conn_state() == ST_CONNECTED) {
		struct rmem_fork m = {.serial = f->serial, .pid = pid < 0 ? -err : pid};
		rm_send(conn.sock, RMEM_FORK_DONE, rm_next_seq(), &m, sizeof m, -1);
	}
	if (pid < 0 && f->had_regions && !f->own && !f->refused) {
		conn.fork_serial--;
		rm_say("rmem: fork failed (", rm_errstr(err),
		       "); if the kernel had raised its FORK event, later children are paired wrongly", NULL);
	}
	if (pid < 0 && f->lost == RM_LOST_GUARD)
		rm_conn_fork_event(); /* (if the kernel raised it, the helper took it already) */
	pthread_mutex_unlock(&conn.req_mu);
}

/* The helper read a FORK event while the agent is lost (resume.c): returns
 * whether it is a lost fork's, whose uffd is to be closed so that the
 * child can register its regions with its own (lost_kind). Any other (a
 * region a program made MADV_DOFORK behind our back, forked past fork(3))
 * is kept open: closing the last reference to a uffd unregisters its
 * ranges, whose missing pages then read as zeros. */
int rm_conn_fork_event(void)
{
	int n = __atomic_load_n(&conn.fork_events, __ATOMIC_ACQUIRE);
	while (n > 0 && !__atomic_compare_exchange_n(&conn.fork_events, &n, n - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		;
	return n > 0;
}

/* fork-adopt, first step, in a fork(3) child (the only thread; threads do
 * not survive fork): new locks (they were held, by the forking thread or
 * the helper), no reply pending, no connection handed to a helper yet, no
 * resume attempt or lost fork of the parent's. Returns whether the child
 * needs a helper thread: it will be connected, or may connect. */
int rm_conn_atfork_child(const struct rm_fork *f)
{
	pthread_mutex_init(&conn.init_mu, NULL);
	pthread_mutex_init(&conn.req_mu, NULL);
	pthread_mutex_init(&conn.reply_mu, NULL);
	pthread_cond_init(&conn.reply_cv, NULL);
	memset(&conn.reply, 0, sizeof conn.reply);
	conn.resuming = conn.lost_fork = 0;
	__atomic_store_n(&conn.fork_events, 0, __ATOMIC_RELEASE);
	sem_init(&conn.ready, 0, 0);
	return !f->lost && (f->state == ST_CONNECTED || f->state == ST_UNINIT);
}

/* A child that inherited regions whose pages the pool held but that no
 * agent serves for it (its parent had lost its agent; or forked without
 * FORK events, it could not get its own uffd served): those pages are
 * lost to it. They must fail loudly, not read as zeros: a uffd with
 * UFFD_FEATURE_SIGBUS turns every missing page of its regions into SIGBUS.
 * wait: its regions are registered with the FORK uffd its parent's helper
 * is about to close (lost_kind): until then registering fails (EBUSY).
 * Without even that, the child cannot run safely. The only thread (but a
 * helper waiting for ready). */
static void child_lost_pages(const char *why, int err, int wait)
{
	rm_say("rmem: forked child: ", why, err ? " (" : "", err ? rm_errstr(err) : "", err ? ")" : "",
	       ": the pages of its memory that were in the pool are lost to it; touching them raises SIGBUS", NULL);
	int fd = rm_uffd_with(UFFD_FEATURE_SIGBUS), rc = fd;
	for (int ms = 0; fd >= 0; ms++) {
		rc = rm_table_register_all(fd, UFFDIO_REGISTER_MODE_MISSING);
		if (rc != -EBUSY || !wait || ms == 30000)
			break;
		struct timespec t = {0, 1000 * 1000};
		rm_sys(SYS_nanosleep, &t, NULL, 0);
	}
	if (rc == 0) {
		set_uffd(fd); /* fd stays open: closing it would unregister */
		conn.features = UFFD_FEATURE_SIGBUS;
		return;
	}
	rm_say("rmem: forked child cannot guard its lost pages (", rm_errstr(-rc), "): exiting", NULL);
	_exit(127);
}

/* A child that did not inherit its parent's regions (RM_LOST_FENCE): their
 * addresses are reserved inaccessible, as in rm_conn_astray, and in glibc
 * mode it has no heap. */
static void child_fenced(void)
{
	rm_table_fence();
	rm_mode_fork_child(rm_table_has_heap());
	rm_say("rmem: forked child of a process whose paged memory no agent serves: it did not inherit that memory"
	       " (touching it raises SIGSEGV) and uses ordinary memory", NULL);
}

/* fork-adopt, in a fork(3) child once the helper thread it needs was
 * started (helper_err: pthread_create's error), after the fork f. It drops
 * what it inherited of its parent's connection, whatever the state
 * (drop_inherited), then: a connection of its own if the parent was
 * connected with regions; none yet without regions (UNINIT: it connects
 * on first use, as a top-level process); if the parent had lost its agent
 * but held regions, their pooled pages are lost to the child too (guarded
 * or fenced: lost_kind), and it uses ordinary memory (OFF). The only
 * thread but the new helper, which waits for ready. */
void rm_conn_fork_adopt(const struct rm_fork *f, int helper_err)
{
	pid_t parent = conn.pid;
	uint64_t features = conn.features, serial = conn.fork_serial;
	set_state(ST_OFF); /* until it has a connection, or may make one */
	drop_inherited();
	conn.pid = getpid();
	conn.fork_serial = 0; /* the child's own forks count from 0 */
	if (f->lost) {
		if (f->lost == RM_LOST_GUARD)
			child_lost_pages("its parent had lost its agent", 0, (features & UFFD_FEATURE_EVENT_FORK) != 0);
		else
			child_fenced();
		return;
	}
	if (!f->had_regions) { /* starts over as a top-level process, or stays off */
		int st = f->state == ST_CONNECTED || f->state == ST_UNINIT ? ST_UNINIT : ST_OFF;
		if (st == ST_UNINIT && helper_err) {
			rm_say("rmem: cannot start the helper thread in a child: using ordinary memory", NULL);
			st = ST_OFF;
		}
		set_state(st);
		return;
	}
	int own = !(features & UFFD_FEATURE_EVENT_FORK);
	if (helper_err) {
		if (own) /* before our regions go unguarded */
			child_lost_pages("cannot start the helper thread", helper_err, 0);
		else
			rm_say("rmem: cannot start the helper thread in a child: using ordinary memory", NULL);
		return;
	}
	struct rm_session s;
	const char *why = NULL;
	int err = own ? rm_hello_fork_own(&s, parent, features, serial, &why)
		      : rm_hello_fork_event(&s, parent, features, serial, &why);
	if (err) {
		if (own)
			child_lost_pages(why ? why : "no agent", -err, 0);
		else
			say_off(why, -err);
		return;
	}
	adopt(&s);
	set_state(ST_CONNECTED);
	sem_post(&conn.ready); /* the helper serves the new connection */
}

/* ---- requests ---- */

/* Sends a request and waits for its ACK or ERROR. Returns 0 or -errno.
 * Preconditions: req_mu held, state connected. */
int rm_request_locked(uint16_t type, const void *body, uint32_t len)
{
	rm_conn_wait_resumed();
	uint32_t seq = rm_next_seq();
	rm_lock(&conn.reply_mu);
	if (conn.reply.dead) {
		pthread_mutex_unlock(&conn.reply_mu);
		return -EPIPE;
	}
	conn.reply.seq = seq;
	conn.reply.done = 0;
	pthread_mutex_unlock(&conn.reply_mu);
	int err = rm_send(conn.sock, type, seq, body, len, -1);
	rm_lock(&conn.reply_mu);
	while (!err && !conn.reply.done && !conn.reply.dead)
		rm_cond_wait(&conn.reply_cv, &conn.reply_mu);
	if (!err)
		err = conn.reply.done ? -conn.reply.err : -EPIPE;
	conn.reply.seq = 0;
	pthread_mutex_unlock(&conn.reply_mu);
	return err;
}

/* The helper thread: the reply to request seq (err 0: ACK). */
void rm_deliver_reply(uint32_t seq, int err)
{
	rm_lock(&conn.reply_mu);
	if (conn.reply.seq == seq && !conn.reply.done) {
		conn.reply.err = err;
		conn.reply.done = 1;
		pthread_cond_broadcast(&conn.reply_cv);
	}
	pthread_mutex_unlock(&conn.reply_mu);
}

/* req_mu, unless this thread is inside a fork, where rm_conn_fork_prepare
 * holds it already (other libraries' atfork handlers may free a region). */
void rm_req_lock(void)
{
	if (!rm_in_fork())
		rm_lock(&conn.req_mu);
}

void rm_req_unlock(void)
{
	if (!rm_in_fork())
		pthread_mutex_unlock(&conn.req_mu);
}
