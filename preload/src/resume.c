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
 * the faulting thread: never zeros), while it goes on looking for an
 * agent. Nothing here allocates. */
#include "rmem.h"

#include <errno.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Blocks while the helper looks for the next agent (ST_RESUMING).
 * Preconditions: reply_mu not held. */
void wait_resumed(void)
{
	if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != ST_RESUMING)
		return;
	pthread_mutex_lock(&reply_mu);
	while (g_state == ST_RESUMING)
		pthread_cond_wait(&reply_cv, &reply_mu);
	pthread_mutex_unlock(&reply_mu);
}

static void set_state(int st)
{
	pthread_mutex_lock(&reply_mu);
	__atomic_store_n(&g_state, st, __ATOMIC_RELEASE);
	if (st == ST_CONNECTED)
		memset(&g_reply, 0, sizeof g_reply);
	pthread_cond_broadcast(&reply_cv);
	pthread_mutex_unlock(&reply_mu);
}

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

static union {
	char buf[RMEM_MAX_PACKET];
	uint64_t align;
} g_rs_pkt;

/* Receives one reply of the resume on s: its type in *type, -errno on
 * failure (descriptors that ride along are closed). */
static int rs_recv(int s, uint16_t *type, void *body, size_t size)
{
	struct rmem_hdr h;
	int n = recv_packet(s, g_rs_pkt.buf, &h, NULL, NULL);
	if (n < 0)
		return n;
	*type = h.type;
	if (h.type == RMEM_ERROR)
		return n >= 8 ? -(int)((struct rmem_error *)(g_rs_pkt.buf + sizeof h))->err : -EPROTO;
	if ((size_t)n != size)
		return -EPROTO;
	memcpy(body, g_rs_pkt.buf + sizeof h, size);
	return 0;
}

/* One try: connect, HELLO (resume), WELCOME, the regions, RESUME_DONE,
 * ACK. Returns 0 with g_sock the new connection, or -errno. */
static int try_resume(int *journaled)
{
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	memcpy(a.sun_path, g_sock_path, sizeof g_sock_path);
	if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
		int e = errno;
		close(s);
		return -e;
	}
	struct timeval tv = {.tv_sec = 10};
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	int old = g_sock;
	g_sock = s; /* send_packet's; no program thread sends while we resume */
	struct rmem_hello hello = {
		.pid = getpid(), .ppid = getppid(), .features = g_features, .page_size = (uint32_t)g_page,
		.flags = RMEM_HELLO_UFFD | RMEM_HELLO_RESUME, .local_mem = g_local_mem,
	};
	int fds[2] = {g_uffd, g_staging_fd};
	struct rmem_welcome w;
	uint16_t type = 0;
	int err = send_packet_fds(RMEM_HELLO, ++g_seq, &hello, sizeof hello, fds, 2);
	if (!err)
		err = rs_recv(s, &type, &w, sizeof w);
	if (!err && (type != RMEM_WELCOME || w.staging_slots != g_slots))
		err = -EPROTO;
	uint32_t n = 0;
	if (!err) {
		*journaled = (w.flags & RMEM_WELCOME_RESUMED) != 0;
		pthread_mutex_lock(&table_mu); /* the layout changes under req_mu + table_mu */
		for (int i = 0; i < g_nregions && !err; i++, n++) {
			struct rmem_region_add m = {g_regions[i].id, g_regions[i].base, g_regions[i].len,
						    (uint32_t)g_regions[i].kind, RMEM_REGION_RESUMED};
			err = send_packet(RMEM_REGION_ADD, ++g_seq, &m, sizeof m, -1);
		}
		pthread_mutex_unlock(&table_mu);
	}
	struct rmem_ack ack;
	struct rmem_resume_done d = {.regions = n};
	if (!err)
		err = send_packet(RMEM_RESUME_DONE, ++g_seq, &d, sizeof d, -1);
	if (!err)
		err = rs_recv(s, &type, &ack, sizeof ack);
	if (!err && type != RMEM_ACK)
		err = -EPROTO;
	if (err) {
		g_sock = old;
		close(s);
		return err;
	}
	tv.tv_sec = 0;
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (old >= 0)
		close(old);
	return 0;
}

/* Answers every fault waiting on the uffd with a poisoned page (SIGBUS):
 * no agent has its data. Other events are read and dropped (a FORK
 * event's uffd is kept open: closing the last reference would give the
 * child zero pages). */
static void poison_faults(void)
{
	struct uffd_msg msgs[16];
	for (;;) {
		ssize_t n = read(g_uffd, msgs, sizeof msgs);
		if (n <= 0)
			return;
		for (size_t i = 0; i < (size_t)n / sizeof msgs[0]; i++) {
			if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			uint64_t page = msgs[i].arg.pagefault.address & ~(uint64_t)(g_page - 1);
#ifdef UFFDIO_POISON
			struct uffdio_poison p = {.range = {.start = page, .len = g_page}};
			if (ioctl(g_uffd, UFFDIO_POISON, &p) == 0 || errno == EEXIST)
				continue;
#endif
			(void)page;
			kill(getpid(), SIGBUS); /* no poison on this kernel: the process then */
		}
	}
}

void resume_loop(void)
{
	int64_t deadline = now_ms() + agent_wait_ms();
	int orphaned = 0;
	for (;;) {
		int journaled = 0;
		if (try_resume(&journaled) == 0) {
			set_state(ST_CONNECTED);
			if (journaled)
				say("rmem: resumed with the agent at ", g_sock_path, NULL);
			else
				say("rmem: resumed with the agent at ", g_sock_path,
				    ", which has no record of this process's pages in the pool: they are lost"
				    " (touching one raises SIGBUS)", NULL);
			return;
		}
		if (!orphaned && now_ms() >= deadline) {
			orphaned = 1;
			set_state(ST_ORPHANED);
			say("rmem: no agent resumed this process within " RMEM_ENV_AGENT_WAIT
			    " (default 60s): its pages in the pool are lost to it; touching one raises SIGBUS", NULL);
		}
		if (orphaned) {
			struct pollfd p = {.fd = g_uffd, .events = POLLIN};
			if (poll(&p, 1, 1000) > 0)
				poison_faults();
		} else {
			struct timespec t = {0, 100 * 1000 * 1000};
			nanosleep(&t, NULL);
		}
	}
}
