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
 *   CONNECTED  --astray-->    OFF (a child forked past fork(3))
 *   in a fork(3) child (fork-adopt): CONNECTED --> CONNECTED (its own
 *   connection), UNINIT (no regions: starts over), or OFF; anything but
 *   OFF --> OFF when it cannot start its helper thread.
 *
 * Locks: init_mu (connect, the fork window), then req_mu (one request at
 * a time; held across a fork), then the region table's table_mu, then
 * reply_mu (the reply slot, and the state's waiters: changes to and from
 * RESUMING and ORPHANED are made under it and broadcast). The state is
 * stored with atomics and read without locks: rm_conn_state, rm_conn_uffd,
 * rm_conn_staging and rm_conn_slots are safe in a signal handler. */
#include "rmem.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <semaphore.h>
#include <string.h>
#include <sys/mman.h>
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
	uint64_t features;
	uint64_t fork_serial; /* forks with regions: FORK events, or FORK_PREPAREs */
	int lost_said;
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

/* Called once, by our constructor, before the helper thread starts. */
void rm_conn_init(void) { sem_init(&conn.ready, 0, 0); }

/* ---- accessors ---- */

int rm_conn_state(void) { return __atomic_load_n(&conn.state, __ATOMIC_ACQUIRE); }
int rm_conn_uffd(void) { return __atomic_load_n(&conn.uffd, __ATOMIC_ACQUIRE); }
char *rm_conn_staging(void) { return __atomic_load_n(&conn.staging, __ATOMIC_ACQUIRE); }
uint32_t rm_conn_slots(void) { return __atomic_load_n(&conn.slots, __ATOMIC_ACQUIRE); }
int rm_conn_sock(void) { return conn.sock; }
int rm_conn_mem_fd(void) { return conn.mem_fd; }

/* Whether this process may talk to the agent. A child made past fork(3)
 * and its atfork handlers (_Fork(), a raw clone) inherited its parent's
 * connection and uffd: it drops them at once (rm_conn_astray). A fork(3)
 * child before our atfork child handler ran (in_fork) has the parent's
 * too, and makes its own in that handler. */
int rm_conn_is_connected(void)
{
	if (rm_conn_state() != ST_CONNECTED)
		return 0;
	if (getpid() == conn.pid)
		return 1;
	if (!rm_in_fork())
		rm_conn_astray();
	return 0;
}

/* The helper thread: waits for a connection to serve; returns its socket. */
int rm_conn_await(void)
{
	while (sem_wait(&conn.ready) != 0)
		;
	return conn.sock;
}

/* Blocks while the helper looks for the next agent (ST_RESUMING).
 * Preconditions: reply_mu not held. */
void rm_conn_wait_resumed(void)
{
	if (rm_conn_state() != ST_RESUMING)
		return;
	pthread_mutex_lock(&conn.reply_mu);
	while (conn.state == ST_RESUMING)
		pthread_cond_wait(&conn.reply_cv, &conn.reply_mu);
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
	rm_offer_min_alloc(s->min_alloc);
	memset(&conn.reply, 0, sizeof conn.reply);
	if (conn.mem_fd >= 0)
		close(conn.mem_fd); /* a fork child's: it names the parent's memory */
	conn.mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
	conn.pid = getpid();
}

/* connect: UNINIT -> CONNECTED or OFF, once (the first caller makes the
 * handshake, the others wait on init_mu). Returns whether connected, and
 * *now when this call connected. Preconditions: in_shim set, req_mu not
 * held, the helper thread started. */
int rm_conn_connect(int *now)
{
	*now = 0;
	pthread_mutex_lock(&conn.init_mu);
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
	pthread_mutex_lock(&conn.reply_mu);
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
	struct rm_session cur = {
		.uffd = conn.uffd, .staging_fd = conn.staging_fd, .slots = conn.slots, .features = conn.features,
	};
	int s = rm_hello_resume(&cur, journaled);
	if (s < 0)
		return s;
	int old = conn.sock;
	conn.sock = s;
	if (old >= 0)
		close(old);
	pthread_mutex_lock(&conn.reply_mu);
	memset(&conn.reply, 0, sizeof conn.reply);
	set_state_locked(ST_CONNECTED);
	pthread_mutex_unlock(&conn.reply_mu);
	return 0;
}

/* orphan: RESUMING -> ORPHANED, no agent came in time: requests fail. */
void rm_conn_orphan(void)
{
	pthread_mutex_lock(&conn.reply_mu);
	set_state_locked(ST_ORPHANED);
	pthread_mutex_unlock(&conn.reply_mu);
}

/* astray: a child made past fork(3) and its atfork handlers (_Fork(), a
 * raw clone), noticed at its first call into the shim: its mode page reads
 * MODE_UNKNOWN (mode.c) or its pid is not the connected one. It did not
 * inherit the regions (MADV_DONTFORK): their addresses are reserved
 * inaccessible (rm_table_fence), so that touching one raises SIGSEGV. It
 * drops its parent's connection and uffd (using them would register memory
 * in the parent's address space and speak for it) and uses ordinary memory
 * from now on; in glibc mode, without its heap if the heap had regions.
 * The only thread: no locks (they may have been held when it was forked). */
void rm_conn_astray(void)
{
	static pid_t done;
	pid_t me = getpid();
	if (done != me && rm_table_count() > 0) {
		done = me;
		int st = ST_CONNECTED;
		if (__atomic_compare_exchange_n(&conn.state, &st, ST_OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			close(conn.sock);
			close(conn.uffd);
			conn.sock = -1;
			set_uffd(-1);
		} else {
			set_state(ST_OFF);
		}
		rm_table_fence();
		rm_say("rmem: this process was forked without fork(3) (_Fork(), a raw clone): it did not inherit its"
		       " parent's paged memory (touching it raises SIGSEGV) and uses ordinary memory from now on",
		       NULL);
	}
	rm_mode_fork_child(rm_table_has_heap());
}

/* fork, prepare (our atfork prepare handler): takes init_mu and req_mu,
 * held across fork(2) (rm_conn_fork_parent releases them; the child makes
 * new ones), so that no request is in flight and the FORK event, the fork
 * serial and the child agree; counts a fork with regions and, without FORK
 * events, has the agent copy the page table for the child (FORK_PREPARE).
 * wrapper: our fork() is the caller (it reports a refusal itself).
 * Preconditions: fork_mu held, not resuming (rm_conn_wait_resumed). */
void rm_conn_fork_prepare(struct rm_fork *f, int wrapper)
{
	pthread_mutex_lock(&conn.init_mu);
	pthread_mutex_lock(&conn.req_mu);
	f->had_regions = conn.state == ST_CONNECTED && getpid() == conn.pid && rm_table_count() > 0;
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
	pthread_mutex_unlock(&conn.req_mu);
	pthread_mutex_unlock(&conn.init_mu);
}

/* fork, done (our fork() wrapper, in the parent): FORK_DONE with the
 * child's pid or fork(2)'s errno; a failed fork with FORK events is not
 * counted (most failures come before the event). Preconditions: in_shim
 * set, req_mu not held. */
void rm_conn_fork_done(const struct rm_fork *f, pid_t pid, int err)
{
	pthread_mutex_lock(&conn.req_mu);
	if (f->prepared && rm_conn_state() == ST_CONNECTED) {
		struct rmem_fork m = {.serial = f->serial, .pid = pid < 0 ? -err : pid};
		rm_send(conn.sock, RMEM_FORK_DONE, rm_next_seq(), &m, sizeof m, -1);
	}
	if (pid < 0 && f->had_regions && !f->own && !f->refused) {
		conn.fork_serial--;
		rm_say("rmem: fork failed (", rm_errstr(err),
		       "); if the kernel had raised its FORK event, later children are paired wrongly", NULL);
	}
	pthread_mutex_unlock(&conn.req_mu);
}

/* fork-adopt, first step, in a fork(3) child (the only thread; threads do
 * not survive fork): new locks (they were held, by the forking thread or
 * the helper), no reply pending, no connection handed to a helper yet.
 * Returns whether the child needs a helper thread (the state is not OFF). */
int rm_conn_atfork_child(void)
{
	pthread_mutex_init(&conn.init_mu, NULL);
	pthread_mutex_init(&conn.req_mu, NULL);
	pthread_mutex_init(&conn.reply_mu, NULL);
	pthread_cond_init(&conn.reply_cv, NULL);
	memset(&conn.reply, 0, sizeof conn.reply);
	sem_init(&conn.ready, 0, 0);
	return conn.state != ST_OFF;
}

/* A child forked without FORK events that could not get its own uffd
 * served: the pages the pool held for it are lost to it. They must fail
 * loudly, not read as zeros: a uffd with UFFD_FEATURE_SIGBUS turns every
 * missing page of its regions into SIGBUS. Without even that, the child
 * cannot run safely. */
static void child_lost_pages(const char *why, int err)
{
	rm_say("rmem: forked child: ", why, err ? " (" : "", err ? rm_errstr(err) : "", err ? ")" : "",
	       ": the pages of its memory that were in the pool are lost to it; touching them raises SIGBUS", NULL);
	int fd = rm_uffd_with(UFFD_FEATURE_SIGBUS);
	if (fd >= 0 && rm_table_register_all(fd, UFFDIO_REGISTER_MODE_MISSING) == 0) {
		set_uffd(fd);
		return; /* fd stays open: closing it would unregister */
	}
	rm_say("rmem: forked child cannot guard its lost pages: exiting", NULL);
	_exit(127);
}

/* fork-adopt, in a fork(3) child once its helper thread was started
 * (helper_err: pthread_create's error): a connection of its own if it
 * inherited regions, else none yet (UNINIT: it connects on first use, as
 * a top-level process). The parent's socket, uffd (registering through it
 * would register in the parent's address space) and staging area are
 * dropped. The only thread but the new helper, which waits for ready. */
void rm_conn_fork_adopt(int had_regions, int helper_err)
{
	int own = had_regions && !(conn.features & UFFD_FEATURE_EVENT_FORK);
	if (helper_err) {
		if (own) /* before our regions go unguarded */
			child_lost_pages("cannot start the helper thread", helper_err);
		else
			rm_say("rmem: cannot start the helper thread in a child: using ordinary memory", NULL);
		set_state(ST_OFF);
		return;
	}
	if (conn.state != ST_CONNECTED)
		return;
	close(conn.sock);
	conn.sock = -1;
	close(conn.uffd);
	set_uffd(-1);
	rm_raw_munmap(conn.staging, (size_t)conn.slots * rm_page);
	__atomic_store_n(&conn.staging, NULL, __ATOMIC_RELEASE);
	close(conn.staging_fd);
	conn.staging_fd = -1;
	if (!had_regions) {
		set_state(ST_UNINIT); /* starts over as a top-level process */
		conn.fork_serial = 0;
		return;
	}
	struct rm_session s;
	const char *why = NULL;
	int err = own ? rm_hello_fork_own(&s, conn.pid, conn.features, conn.fork_serial, &why)
		      : rm_hello_fork_event(&s, conn.pid, conn.features, conn.fork_serial, &why);
	conn.fork_serial = 0; /* the child's own forks count from 0 */
	if (err) {
		if (own)
			child_lost_pages(why ? why : "no agent", -err);
		else
			say_off(why, -err);
		set_state(ST_OFF);
		return;
	}
	adopt(&s);
	sem_post(&conn.ready); /* the helper serves the new connection */
}

/* ---- requests ---- */

/* Sends a request and waits for its ACK or ERROR. Returns 0 or -errno.
 * Preconditions: req_mu held, state connected. */
int rm_request_locked(uint16_t type, const void *body, uint32_t len)
{
	rm_conn_wait_resumed();
	uint32_t seq = rm_next_seq();
	pthread_mutex_lock(&conn.reply_mu);
	if (conn.reply.dead) {
		pthread_mutex_unlock(&conn.reply_mu);
		return -EPIPE;
	}
	conn.reply.seq = seq;
	conn.reply.done = 0;
	pthread_mutex_unlock(&conn.reply_mu);
	int err = rm_send(conn.sock, type, seq, body, len, -1);
	pthread_mutex_lock(&conn.reply_mu);
	while (!err && !conn.reply.done && !conn.reply.dead)
		pthread_cond_wait(&conn.reply_cv, &conn.reply_mu);
	if (!err)
		err = conn.reply.done ? -conn.reply.err : -EPIPE;
	conn.reply.seq = 0;
	pthread_mutex_unlock(&conn.reply_mu);
	return err;
}

/* The helper thread: the reply to request seq (err 0: ACK). */
void rm_deliver_reply(uint32_t seq, int err)
{
	pthread_mutex_lock(&conn.reply_mu);
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
		pthread_mutex_lock(&conn.req_mu);
}

void rm_req_unlock(void)
{
	if (!rm_in_fork())
		pthread_mutex_unlock(&conn.req_mu);
}
