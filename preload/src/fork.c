/* fork.
 *
 * All the work is done by our atfork handlers, registered at the
 * process's first call into the shim (alloc.c's decide), before the
 * allocators that call our mmap or sbrk while they initialize register
 * theirs (jemalloc and tcmalloc do so after their first mapping, measured).
 * Prepare handlers run in the reverse order of registration, so ours runs
 * after every other one that may allocate, and after a foreign allocator
 * took its locks: the lock order (rmem.h) holds, allocator locks before
 * ours, in the forking thread as in one inside an allocator's mmap. The
 * embedded jemalloc's handlers are called by ours (heap.c). Our prepare
 * handler holds fork_mu, jemalloc's locks, init_mu and req_mu across
 * fork(2): no request is in flight, the region table is stable, and the
 * FORK event, the fork serial and the child agree. Inside that window
 * (in_fork) this thread allocates from glibc and defers frees and unmaps
 * of the heap and regions until the parent and child handlers.
 *
 * The fork() wrapper only adds what an atfork parent handler cannot know,
 * the child's pid or fork(2)'s failure: it sends FORK_DONE with it and
 * corrects the serial of a failed fork, holding fork_mu until then so
 * that no other fork interleaves. A fork inside the C library (glibc's
 * daemon()) sends pid 0.
 *
 * Without FORK events (the uffd has none unless the process has
 * CAP_SYS_PTRACE), the child's regions are plain memory with the evicted
 * pages missing: FORK_PREPARE has the agent make the child's copy of its
 * page table (sharing the pooled pages) before fork(2), the child
 * registers the regions with a uffd of its own before fork() returns to
 * it (HS_FORK_OWN), and FORK_DONE tells the agent how fork(2) went. If the
 * agent cannot keep the pages for the child, the wrapper's fork() fails
 * with ENOMEM (the child exits at once, in our child handler, and is
 * reaped); a fork inside the C library goes on and its child gets SIGBUS
 * on the pages it lost (child_lost_pages).
 *
 * _Fork() and raw clones run no handlers: nothing would serve the child's
 * regions (without FORK events its evicted pages would read as zeros) and,
 * with FORK events, the event they raise would go uncounted, pairing the
 * parent's next child with this one's uffd. So regions are MADV_DONTFORK
 * except across the forks we see: such a child does not inherit them at
 * all, touching one raises SIGSEGV (astray_child), and no FORK event is
 * raised for it. */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;

/* The fork in progress in this thread. */
static TLS struct {
	int active;      /* our prepare handler ran: the parent or child one finishes */
	int held;        /* fork_mu is held for the wrapper */
	int wrapper;     /* our fork() is in fork(3) */
	int had_regions; /* the child inherits regions */
	int own;         /* no FORK events: FORK_PREPARE, a uffd of the child's own */
	int prepared;    /* FORK_PREPARE was ACKed: FORK_DONE must follow */
	int refused;     /* FORK_PREPARE failed with this -errno */
	uint64_t serial;
} t_fork;

static void atfork_prepare(void);
static void atfork_parent(void);
static void atfork_child(void);

void fork_register(void)
{
	static int done;
	if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* A child forked without FORK events that could not get its own uffd
 * served: the pages the pool held for it are lost to it. They must fail
 * loudly, not read as zeros: a uffd with UFFD_FEATURE_SIGBUS turns every
 * missing page of its regions into SIGBUS. Without even that, the child
 * cannot run safely. */
void child_lost_pages(const char *why, int err)
{
	say("rmem: forked child: ", why, err ? " (" : "", err ? errstr(err) : "", err ? ")" : "",
	    ": the pages of its memory that were in the pool are lost to it; touching them raises SIGBUS", NULL);
	int fd = uffd_with(UFFD_FEATURE_SIGBUS);
	if (fd >= 0 && register_all(fd, UFFDIO_REGISTER_MODE_MISSING) == 0) {
		g_uffd = fd;
		return; /* fd stays open: closing it would unregister */
	}
	say("rmem: forked child cannot guard its lost pages: exiting", NULL);
	_exit(127);
}

/* A child made past fork(3) and its atfork handlers (_Fork(), a raw
 * clone), noticed at its first call into the shim: its mode page reads
 * MODE_UNKNOWN (alloc.c) or its pid is not the connected one. It did not
 * inherit the regions (MADV_DONTFORK): their addresses are reserved
 * inaccessible, so that touching one raises SIGSEGV and no other mapping
 * lands where the table still names a region. It drops its parent's
 * connection and uffd (using them would register memory in the parent's
 * address space and speak for it) and uses ordinary memory from now on;
 * in glibc mode, without its heap if the heap had regions. The only
 * thread: no locks (they may have been held when it was forked). */
void astray_child(void)
{
	static pid_t done;
	pid_t me = getpid();
	int n = __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE), heap = 0;
	if (done != me && n > 0) {
		done = me;
		int st = ST_CONNECTED;
		if (__atomic_compare_exchange_n(&g_state, &st, ST_OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			close(g_sock);
			close(g_uffd);
			g_sock = g_uffd = -1;
		} else {
			__atomic_store_n(&g_state, ST_OFF, __ATOMIC_RELEASE);
		}
		for (int i = 0; i < n; i++)
			raw_mmap((void *)g_regions[i].base, g_regions[i].len, PROT_NONE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
		say("rmem: this process was forked without fork(3) (_Fork(), a raw clone): it did not inherit its"
		    " parent's paged memory (touching it raises SIGSEGV) and uses ordinary memory from now on",
		    NULL);
	}
	for (int i = 0; i < n && !heap; i++)
		heap = g_regions[i].kind == KIND_HEAP;
	alloc_fork_child(heap);
}

/* In a fork(3) child, before fork() returns: a helper thread of its own,
 * a connection of its own if it inherited regions. The only thread. */
static void child_after_fork(int had_regions)
{
	pthread_mutex_init(&fork_mu, NULL);
	pthread_mutex_init(&init_mu, NULL);
	pthread_mutex_init(&req_mu, NULL);
	pthread_mutex_init(&table_mu, NULL); /* the helper may have held it */
	pthread_mutex_init(&reply_mu, NULL);
	pthread_cond_init(&reply_cv, NULL);
	memset(&g_reply, 0, sizeof g_reply);
	sem_init(&g_conn_sem, 0, 0);
	g_helper_exists = 0; /* threads do not survive fork */
	if (g_state == ST_OFF)
		return;
	int own = had_regions && !(g_features & UFFD_FEATURE_EVENT_FORK);
	/* A foreign allocator's locks are still held here (its child handler
	 * runs after ours): the new thread's allocations come from the
	 * bootstrap arena (alloc.c), and it never frees them. */
	t_boot = 1;
	int err = start_helper();
	t_boot = 0;
	if (err) {
		if (own) /* before our regions go unguarded */
			child_lost_pages("cannot start the helper thread", err);
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
	close(g_staging_fd);
	g_staging_fd = -1;
	if (!had_regions) {
		g_state = ST_UNINIT; /* starts over as a top-level process */
		g_fork_serial = 0;
		return;
	}
	const char *why = NULL;
	err = handshake(own ? HS_FORK_OWN : HS_FORK_EVENT, &why);
	g_fork_serial = 0; /* the child's own forks count from 0 */
	if (err) {
		if (own)
			child_lost_pages(why ? why : "no agent", -err);
		else
			say_off(why, -err);
		g_state = ST_OFF;
	}
}

static void atfork_prepare(void)
{
	if (in_shim)
		return; /* the shim's own fork (none), or a fork of ours in_shim */
	int e = errno;
	/* A fork while the agent is away waits for the next one (bounded,
	 * resume.c): the child's regions need a FORK event or FORK_PREPARE
	 * served. Before any lock: the helper that resumes takes table_mu. */
	wait_resumed();
	pthread_mutex_lock(&fork_mu);
	heap_prefork();
	pthread_mutex_lock(&init_mu);
	pthread_mutex_lock(&req_mu);
	t_fork.active = 1;
	t_fork.held = 0;
	t_fork.had_regions = g_state == ST_CONNECTED && getpid() == g_pid &&
			     __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE) > 0;
	t_fork.own = t_fork.had_regions && !(g_features & UFFD_FEATURE_EVENT_FORK);
	t_fork.prepared = t_fork.refused = 0;
	if (t_fork.had_regions)
		g_fork_serial++;
	t_fork.serial = g_fork_serial;
	if (t_fork.own) {
		struct rmem_fork f = {.serial = g_fork_serial};
		in_shim++;
		int err = request_locked(RMEM_FORK_PREPARE, &f, sizeof f);
		if (err && !t_fork.wrapper)
			say("rmem: the agent cannot keep this process's pooled pages for a child forked inside the C"
			    " library (daemon()): the child gets SIGBUS on them", NULL);
		in_shim--;
		t_fork.prepared = !err;
		t_fork.refused = err;
	}
	if (t_fork.had_regions)
		fork_advice_locked(MADV_DOFORK); /* the parent and child handlers undo it */
	in_fork = 1;
	errno = e;
}

static void atfork_parent(void)
{
	if (!t_fork.active)
		return;
	int e = errno;
	t_fork.active = 0;
	in_fork = 0;
	in_shim++;
	if (t_fork.had_regions)
		fork_advice_locked(MADV_DONTFORK);
	run_deferred_locked();
	if (t_fork.prepared && !t_fork.wrapper) {
		struct rmem_fork f = {.serial = t_fork.serial, .pid = 0}; /* not known here */
		send_packet(RMEM_FORK_DONE, ++g_seq, &f, sizeof f, -1);
	}
	pthread_mutex_unlock(&req_mu);
	pthread_mutex_unlock(&init_mu);
	heap_postfork_parent();
	in_shim--;
	alloc_run_deferred(); /* the program's frees: not in_shim */
	if (t_fork.wrapper)
		t_fork.held = 1;
	else
		pthread_mutex_unlock(&fork_mu);
	errno = e;
}

static void atfork_child(void)
{
	if (!t_fork.active)
		return;
	if (t_fork.refused && t_fork.wrapper)
		_exit(127); /* the wrapper fails this fork and reaps us */
	int e = errno;
	t_fork.active = 0;
	alloc_fork_child(0); /* the mode page was wiped */
	in_shim++;
	if (t_fork.had_regions)
		fork_advice_locked(MADV_DONTFORK);
	child_after_fork(t_fork.had_regions);
	pthread_mutex_lock(&req_mu); /* the helper may run already */
	run_deferred_locked();
	pthread_mutex_unlock(&req_mu);
	in_fork = 0;
	heap_postfork_child();
	in_shim--;
	alloc_run_deferred();
	errno = e;
}

EXPORT pid_t fork(void)
{
	enter();
	if (!real_fork) {
		errno = ENOSYS;
		return -1;
	}
	if (in_shim)
		return real_fork();
	t_fork.wrapper = 1;
	pid_t pid = real_fork();
	int e = errno;
	t_fork.wrapper = 0;
	if (pid == 0 || !t_fork.held)
		return pid; /* the child; or our handlers did not run */
	if (t_fork.refused) {
		if (pid > 0)
			while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
				;
		in_shim++;
		say("rmem: fork refused: the agent cannot keep this process's pooled pages for a child (",
		    errstr(-t_fork.refused), ")", NULL);
		in_shim--;
		pid = -1;
		e = ENOMEM;
	}
	in_shim++;
	pthread_mutex_lock(&req_mu);
	if (t_fork.prepared && __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == ST_CONNECTED) {
		struct rmem_fork f = {.serial = t_fork.serial, .pid = pid < 0 ? -e : pid};
		send_packet(RMEM_FORK_DONE, ++g_seq, &f, sizeof f, -1);
	}
	if (pid < 0 && t_fork.had_regions && !t_fork.own && !t_fork.refused) {
		g_fork_serial--; /* no child, and most failures come before the FORK event */
		say("rmem: fork failed (", errstr(e),
		    "); if the kernel had raised its FORK event, later children are paired wrongly", NULL);
	}
	pthread_mutex_unlock(&req_mu);
	in_shim--;
	t_fork.held = 0;
	pthread_mutex_unlock(&fork_mu);
	errno = e;
	return pid;
}
