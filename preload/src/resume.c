/* Resuming with the next agent (docs/pager.md, Agent restart). When the
 * agent goes away (killed, restarted), the process keeps its uffd, its
 * regions and its staging area; faults on pages the agent had evicted wait
 * in the kernel, and requests (REGION_ADD, DEL, ZAP, FORK_PREPARE) wait
 * here. The helper thread connects again, every 100 ms, and says a
 * resuming HELLO (the uffd and the staging memfd), re-announces every
 * region (REGION_ADD, RMEM_REGION_RESUMED) and RESUME_DONE; the agent then
 * serves the process from the journal its predecessor left.
 *
 * If none does within RMEM_AGENT_WAIT (default 60 s), the process is
 * orphaned: it says so, requests fail (new memory is ordinary), and the
 * helper answers every fault on the uffd with UFFDIO_POISON (SIGBUS for
 * the faulting thread: never zeros), and in ring mode every fault posted to
 * the fault ring LOST, poisoned (ring.c), while it goes on looking for an
 * agent; it closes the FORK uffd of a child forked meanwhile, which guards
 * its pooled pages itself (conn.c's lost_kind). The connection changes
 * through conn.c's transitions (resume, orphan); the HELLO is wire.c's.
 * Nothing here allocates. */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* RMEM_AGENT_WAIT in ms: "90s", "1500ms", "2m" or seconds; default 60 s. */
static int64_t agent_wait_ms(void)
{
	const char *s = getenv(RMEM_ENV_AGENT_WAIT);
	if (!s || !*s)
		return 60000;
	char *end;
	double v = strtod(s, &end);
	int64_t ms = -1;
	if (end != s && v > 0) {
		if (!*end || !strcmp(end, "s"))
			ms = (int64_t)(v * 1000);
		else if (!strcmp(end, "ms"))
			ms = (int64_t)v;
		else if (!strcmp(end, "m"))
			ms = (int64_t)(v * 60000);
	}
	return ms > 0 ? ms : 60000;
}

/* Answers every fault waiting on the uffd with a poisoned page (SIGBUS):
 * no agent has its data. But a write to a page the agent write-protected
 * (the pager restores pages so, to see them dirtied) is let through: that
 * page is here and right (poisoning it fails, EEXIST, and the writer
 * waited for good; a next agent takes a page without the protection for
 * dirty, from its pagemap). A FORK event's uffd is closed if it is a lost
 * fork's (rm_conn_fork_event: the child guards its pages itself), else
 * kept open: closing the last reference would give that child zero pages.
 * Other events are read and dropped. */
static void poison_faults(int uffd)
{
	struct uffd_msg msgs[16];
	for (;;) {
		long n = rm_sys(SYS_read, uffd, msgs, sizeof msgs);
		if (n <= 0)
			return;
		for (size_t i = 0; i < (size_t)n / sizeof msgs[0]; i++) {
			if (msgs[i].event == UFFD_EVENT_FORK && rm_conn_fork_event())
				close((int)msgs[i].arg.fork.ufd);
			if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			uint64_t page = msgs[i].arg.pagefault.address & ~(uint64_t)(rm_page - 1);
			if (msgs[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) {
				struct uffdio_writeprotect wp = {.range = {.start = page, .len = rm_page}, .mode = 0};
				if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) != 0) /* (it wakes the writer) */
					ioctl(uffd, UFFDIO_WAKE, &wp.range); /* it faults again */
				continue;
			}
#ifdef UFFDIO_POISON
			struct uffdio_poison p = {.range = {.start = page, .len = rm_page}};
			if (ioctl(uffd, UFFDIO_POISON, &p) == 0 || errno == EEXIST)
				continue;
#endif
			(void)page;
			kill(getpid(), SIGBUS); /* no poison on this kernel: the process then */
		}
	}
}

/* One turn of the orphaned helper (for a second at most): the faults on
 * the uffd, and in ring mode those posted to the fault ring, which it
 * answers as the agent would (ring.c: LOST, poisoned), sleeping in poll(2)
 * on the uffd and the doorbell meanwhile, the ring's agent word ASLEEP so
 * that a post rings it. */
static void orphan_turn(void)
{
	struct pollfd p[2] = {{.fd = rm_conn_uffd(), .events = POLLIN}, {.fd = rm_conn_doorbell(), .events = POLLIN}};
	struct timespec t = {1, 0};
	rm_ring_agent_word(1);
	int answered = rm_ring_serve_lost(p[0].fd); /* (posts made before ASLEEP was seen) */
	if (!answered && rm_sys4(SYS_ppoll, p, p[1].fd >= 0 ? 2 : 1, &t, NULL) > 0 && (p[0].revents & POLLIN))
		poison_faults(p[0].fd);
	rm_ring_agent_word(0);
	if (p[1].fd >= 0 && (p[1].revents & POLLIN)) {
		uint64_t v;
		rm_sys(SYS_read, p[1].fd, &v, sizeof v); /* rung: it does not block */
	}
	rm_ring_serve_lost(p[0].fd);
}

/* The helper thread, once the connection was lost with regions: until an
 * agent resumes this process. */
void rm_resume_loop(void)
{
	int64_t deadline = now_ms() + agent_wait_ms();
	int orphaned = 0;
	for (;;) {
		int journaled = 0;
		if (rm_conn_resume(&journaled) == 0) {
			if (journaled)
				rm_say("rmem: resumed with the agent at ", rm_sock_path(), NULL);
			else
				rm_say("rmem: resumed with the agent at ", rm_sock_path(),
				    ", which has no record of this process's pages in the pool: they are lost"
				    " (touching one raises SIGBUS)", NULL);
			return;
		}
		if (!orphaned && now_ms() >= deadline) {
			orphaned = 1;
			rm_conn_orphan();
			rm_say("rmem: no agent resumed this process within " RMEM_ENV_AGENT_WAIT
			    " (default 60s): its pages in the pool are lost to it; touching one raises SIGBUS", NULL);
		}
		if (orphaned) {
			orphan_turn();
		} else {
			struct timespec t = {0, 100 * 1000 * 1000};
			rm_sys(SYS_nanosleep, &t, NULL, 0);
		}
	}
}
