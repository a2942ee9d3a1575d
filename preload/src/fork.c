/* fork.
 *
 * All the work is done by our atfork handlers, registered at the
 * process's first call into the shim (alloc.c's decide, the one call up
 * the layers: rmem.h), before the
 * allocators that call our mmap or sbrk while they initialize register
 * theirs (jemalloc and tcmalloc do so after their first mapping, measured).
 * Prepare handlers run in the reverse order of registration, so ours runs
 * after every other one that may allocate, and after a foreign allocator
 * took its locks: the lock order (rmem.h) holds, allocator locks before
 * ours, in the forking thread as in one inside an allocator's mmap. The
 * embedded jemalloc's handlers are called by ours (heap.c). Our prepare
 * handler holds fork_mu, jemalloc's locks, init_mu and req_mu across
 * fork(2) (conn.c's fork transitions: rm_conn_fork_prepare, then
 * rm_conn_fork_parent in the parent, rm_conn_atfork_child and
 * rm_conn_fork_adopt in the child): no request is in flight, the region
 * table is stable, and the FORK event, the fork serial and the child
 * agree. Inside that window
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
 * it (wire.c's rm_hello_fork_own), and FORK_DONE tells the agent how
 * fork(2) went. If the agent cannot keep the pages for the child, the
 * wrapper's fork() fails with ENOMEM (the child exits at once, in our
 * child handler, and is reaped); a fork inside the C library goes on and
 * its child gets SIGBUS on the pages it lost (conn.c's child_lost_pages).
 *
 * A fork while the agent is lost (orphaned, or off after a malformed
 * packet) with regions left is not counted and asks nothing of an agent:
 * the child drops its parent's connection and either inherits the
 * regions and guards their pooled pages with a uffd of its own (SIGBUS),
 * or does not inherit them (fenced: SIGSEGV) where a FORK event could
 * wait for a reader that may never come (conn.c's lost_kind).
 *
 * _Fork() and raw clones run no handlers: nothing would serve the child's
 * regions (without FORK events its evicted pages would read as zeros) and,
 * with FORK events, the event they raise would go uncounted, pairing the
 * parent's next child with this one's uffd. So regions are MADV_DONTFORK
 * except across the forks we see: such a child does not inherit them at
 * all, touching one raises SIGSEGV (conn.c's rm_conn_astray), and no FORK
 * event is raised for it. */
#include "rmem.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;

/* The fork in progress in this thread. */
static TLS struct {
	int active;  /* our prepare handler ran: the parent or child one finishes */
	int held;    /* fork_mu is held for the wrapper */
	int wrapper; /* our fork() is in fork(3) */
	struct rm_fork c;
} t_fork;

static void atfork_prepare(void);
static void atfork_parent(void);
static void atfork_child(void);

void rm_fork_register(void)
{
	static int done;
	if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* In a fork(3) child, before fork() returns: a helper thread of its own
 * if it may connect, a connection of its own if it inherited regions
 * served, its parent's dropped whatever their state (conn.c). The only
 * thread. */
static void child_after_fork(const struct rm_fork *f)
{
	pthread_mutex_init(&fork_mu, NULL);
	rm_table_atfork_child(); /* the helper may have held table_mu */
	rm_sigbus_atfork_child(); /* its SIGBUS disposition is its own */
	rm_pin_atfork_child();    /* the other threads' pins were not */
	rm_ring_atfork_child();   /* its thread's id is new */
	rm_helper_atfork_child();
	int err = 0;
	if (rm_conn_atfork_child(f)) {
		/* A foreign allocator's locks are still held here (its child
		 * handler runs after ours): the new thread's allocations come
		 * from the bootstrap arena (alloc.c), and it never frees them. */
		rm_set_boot(1);
		err = rm_helper_start();
		rm_set_boot(0);
	}
	rm_conn_fork_adopt(f, err);
}

static void atfork_prepare(void)
{
	if (rm_in_shim())
		return; /* the shim's own fork (none), or a fork of ours in_shim */
	int e = errno;
	/* A fork while the agent is away waits for the next one (bounded,
	 * resume.c): the child's regions need a FORK event or FORK_PREPARE
	 * served. Before any lock: the helper that resumes takes table_mu. */
	rm_conn_wait_resumed();
	rm_lock(&fork_mu);
	rm_heap_prefork();
	rm_conn_fork_prepare(&t_fork.c, t_fork.wrapper); /* init_mu, req_mu */
	t_fork.active = 1;
	t_fork.held = 0;
	if (t_fork.c.inherit)
		rm_table_fork_advice(MADV_DOFORK); /* the parent and child handlers undo it */
	rm_set_in_fork(1);
	errno = e;
}

static void atfork_parent(void)
{
	if (!t_fork.active)
		return;
	int e = errno;
	t_fork.active = 0;
	rm_set_in_fork(0);
	rm_shim_enter();
	if (t_fork.c.inherit)
		rm_table_fork_advice(MADV_DONTFORK);
	rm_run_deferred_locked();
	rm_conn_fork_parent(&t_fork.c, t_fork.wrapper); /* releases req_mu, init_mu */
	rm_heap_postfork_parent();
	rm_shim_leave();
	rm_alloc_run_deferred(); /* the program's frees: not in_shim */
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
	if (t_fork.c.refused && t_fork.wrapper)
		_exit(127); /* the wrapper fails this fork and reaps us */
	int e = errno;
	t_fork.active = 0;
	rm_mode_fork_child(0); /* the mode page was wiped */
	rm_shim_enter();
	if (t_fork.c.inherit)
		rm_table_fork_advice(MADV_DONTFORK);
	child_after_fork(&t_fork.c);
	/* Out of the fork window, as in the parent handler: the new req_mu
	 * (the helper may run already) is taken, not assumed held. */
	rm_set_in_fork(0);
	rm_req_lock();
	rm_run_deferred_locked();
	rm_req_unlock();
	rm_heap_postfork_child();
	rm_shim_leave();
	rm_alloc_run_deferred();
	errno = e;
}

EXPORT pid_t fork(void)
{
	rm_enter();
	rm_fork_fn *real_fork = rm_real_fork();
	if (!real_fork) {
		errno = ENOSYS;
		return -1;
	}
	if (rm_in_shim())
		return real_fork();
	t_fork.wrapper = 1;
	pid_t pid = real_fork();
	int e = errno;
	t_fork.wrapper = 0;
	if (pid == 0 || !t_fork.held)
		return pid; /* the child; or our handlers did not run */
	if (t_fork.c.refused) {
		if (pid > 0)
			while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
				;
		rm_shim_enter();
		rm_say("rmem: fork refused: the agent cannot keep this process's pooled pages for a child (",
		       rm_errstr(-t_fork.c.refused), ")", NULL);
		rm_shim_leave();
		pid = -1;
		e = ENOMEM;
	}
	rm_shim_enter();
	rm_conn_fork_done(&t_fork.c, pid, e);
	rm_shim_leave();
	t_fork.held = 0;
	pthread_mutex_unlock(&fork_mu);
	errno = e;
	return pid;
}
