/* The connection to memagent: packets, the process's userfaultfd, the
 * handshake (one path for the three ways a process says HELLO), and the
 * requests program threads make (one at a time, req_mu; the helper thread
 * hands them their reply). Nothing here allocates: it runs inside other
 * allocators' mmap calls. */
#include "rmem.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

/* No UFFD_FEATURE_EVENT_REMOVE: a REMOVE event blocks the thread that
 * called madvise until the agent reads it, which made every run of an
 * eviction batch (the helper's MADV_DONTNEED) a round trip between two
 * threads, and made the agent's ioctls fail with EAGAIN meanwhile. The
 * program's own drops reach the agent as REGION_ZAP (interpose.c). */
#define UFFD_FEATURES                                                          \
	(UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |                  \
	 UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP |           \
	 UFFD_FEATURE_THREAD_ID)

int g_state = ST_UNINIT;
pid_t g_pid;
int g_uffd = -1;
static int g_uffd_dev = -1; /* /dev/userfaultfd lent by the agent (UFFD_DEVICE), kept for forks */
int g_sock = -1;
int g_mem_fd = -1;
char *g_staging;
int g_staging_fd = -1;
uint32_t g_slots;
uint64_t g_features;
uint64_t g_fork_serial; /* forks with regions: FORK events, or FORK_PREPAREs */
uint32_t g_seq;
uint64_t g_next_id = 1;
static int g_lost_said;

pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t req_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t reply_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t reply_cv = PTHREAD_COND_INITIALIZER;
struct reply g_reply;

static void set_off(void) { __atomic_store_n(&g_state, ST_OFF, __ATOMIC_RELEASE); }

int send_packet(uint16_t type, uint32_t seq, const void *body, uint32_t len, int fd)
{
	return send_packet_fds(type, seq, body, len, &fd, fd >= 0 ? 1 : 0);
}

/* Sends one packet with nfds (0..RMEM_MAX_FDS) descriptors on g_sock. */
int send_packet_fds(uint16_t type, uint32_t seq, const void *body, uint32_t len, const int *fds, int nfds)
{
	struct rmem_hdr h = {RMEM_MAGIC, RMEM_VERSION, type, seq, len};
	struct iovec iov[2] = {{&h, sizeof h}, {(void *)body, len}};
	union {
		char buf[CMSG_SPACE(RMEM_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
	if (nfds > 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
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
int recv_packet(int sock, void *buf, struct rmem_hdr *h, int *fds, int *nfds)
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
 * agent paged out stays out: its faults wait (we hold the uffd). A process
 * with regions looks for the next agent to resume it (the helper, in
 * resume.c); requests wait for that. A malformed packet is not an agent
 * that went away: no resuming then. */
void lost_agent(int err)
{
	int resume = err != EPROTO && getpid() == g_pid && __atomic_load_n(&g_nregions, __ATOMIC_ACQUIRE) > 0 &&
		     __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == ST_CONNECTED;
	pthread_mutex_lock(&reply_mu);
	g_reply.dead = 1;
	__atomic_store_n(&g_state, resume ? ST_RESUMING : ST_OFF, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&reply_cv);
	pthread_mutex_unlock(&reply_mu);
	if (!__atomic_exchange_n(&g_lost_said, 1, __ATOMIC_ACQ_REL)) {
		if (resume)
			say("rmem: lost the agent (", errstr(err),
			    "): waiting for an agent to resume this process; meanwhile faults on paged-out memory wait",
			    NULL);
		else
			say("rmem: lost the agent (", errstr(err),
			    "): new allocations use ordinary memory; paged-out memory waits for an agent", NULL);
	}
}

/* Sends a request and waits for its ACK or ERROR. Returns 0 or -errno.
 * Preconditions: req_mu held, state connected. */
int request_locked(uint16_t type, const void *body, uint32_t len)
{
	wait_resumed();
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

void deliver_reply(uint32_t seq, int err)
{
	pthread_mutex_lock(&reply_mu);
	if (g_reply.seq == seq && !g_reply.done) {
		g_reply.err = err;
		g_reply.done = 1;
		pthread_cond_broadcast(&reply_cv);
	}
	pthread_mutex_unlock(&reply_mu);
}

/* A new userfaultfd of this process: through /dev/userfaultfd, else the
 * system call (both need privileges or the administrator's leave: the
 * device's mode, vm.unprivileged_userfaultfd), else through the device the
 * agent lent us. UFFD_USER_MODE_ONLY, which any user may have, is not
 * used but for tests (RMEM_UFFD_USER_MODE): the kernel's own accesses to our memory (read(2) into a buffer
 * whose pages are in the pool) would fail with EFAULT instead of faulting
 * them in. Returns the fd or -errno. */
/* RMEM_UFFD_USER_MODE=1: test programs without root, which touch their
 * memory from their own code only (proto.h). Read once. */
static int uffd_user_mode(void)
{
	static int user_mode = -1;
	if (user_mode < 0) {
		const char *um = getenv(RMEM_ENV_UFFD_USER_MODE);
		user_mode = um && strcmp(um, "1") == 0;
	}
	return user_mode;
}

static int new_uffd(void)
{
	int fd = -1, e = EPERM;
	if (uffd_user_mode()) {
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
		return fd >= 0 ? fd : -errno;
	}
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
int uffd_with(uint64_t features)
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
	if ((fd == -EPERM || fd == -EACCES) && g_uffd_dev < 0 && s >= 0 && !uffd_user_mode()) {
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

/* Connects, sends HELLO (with our uffd unless HS_FORK_EVENT) and takes the
 * WELCOME: maps the staging memfd; an HS_FORK_EVENT child also gets its
 * uffd. Returns 0 or -errno with *why set. Preconditions: init_mu held (or
 * the only thread, in a fork child). */
int handshake(enum hs mode, const char **why)
{
	if (!g_helper_exists) {
		*why = "no helper thread";
		return -EAGAIN;
	}
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
	if (g_staging_fd >= 0)
		close(g_staging_fd);
	g_staging_fd = fds[0];
	if (mode == HS_FORK_EVENT)
		g_uffd = fds[1];
	else if (nfds == 2)
		close(fds[1]);
	if (!g_min_from_env && w.min_alloc > 0)
		g_min_alloc = (size_t)w.min_alloc;
	tv.tv_sec = 0;
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	memset(&g_reply, 0, sizeof g_reply);
	if (g_mem_fd >= 0)
		close(g_mem_fd); /* a fork child's: it names the parent's memory */
	g_mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
	g_pid = getpid();
	sem_post(&g_conn_sem); /* the helper serves the new connection */
	return 0;
}

void say_off(const char *why, int err)
{
	if (why)
		say("rmem: ", why, " (", errstr(err), "): using ordinary memory", NULL);
	else
		say("rmem: no agent at ", g_sock_path, " (", errstr(err), "): using ordinary memory", NULL);
}

/* Whether this process may talk to the agent. A child made past fork(3)
 * and its atfork handlers (_Fork(), a raw clone) inherited its parent's
 * connection and uffd: it drops them at once (astray_child). A fork(3)
 * child before our atfork child handler ran (in_fork) has the parent's
 * too, and makes its own in that handler. */
int is_connected(void)
{
	if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != ST_CONNECTED)
		return 0;
	if (getpid() == g_pid)
		return 1;
	if (!in_fork)
		astray_child();
	return 0;
}

/* Whether new memory can go to the agent, connecting on first use (then
 * registering the pending ranges). Not inside a fork (fork.c holds
 * init_mu, and the region set is frozen there), nor before our
 * constructor created the helper thread. Preconditions: in_shim set,
 * req_mu not held. */
int connected(void)
{
	if (in_fork)
		return 0;
	int st = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
	if (st != ST_UNINIT)
		return is_connected();
	if (!__atomic_load_n(&g_ctor_done, __ATOMIC_ACQUIRE) || !g_helper_exists)
		return 0;
	int now = 0;
	pthread_mutex_lock(&init_mu);
	if (g_state == ST_UNINIT) {
		const char *why = NULL;
		int err = handshake(HS_TOP, &why); /* opens the uffd once connected */
		if (err) {
			say_off(why, -err);
			set_off();
		} else {
			__atomic_store_n(&g_state, ST_CONNECTED, __ATOMIC_RELEASE);
			now = 1;
		}
	}
	st = g_state;
	pthread_mutex_unlock(&init_mu);
	if (now)
		pending_register();
	return st == ST_CONNECTED;
}

/* req_mu, unless this thread is inside a fork, where fork.c holds it
 * already (other libraries' atfork handlers may free a region). */
void req_lock(void)
{
	if (!in_fork)
		pthread_mutex_lock(&req_mu);
}

void req_unlock(void)
{
	if (!in_fork)
		pthread_mutex_unlock(&req_mu);
}
