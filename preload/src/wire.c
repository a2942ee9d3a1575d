/* Talking to memagent: packets on a socket given by the caller, new
 * userfaultfds, and the handshakes: the three ways a process says HELLO
 * (top-level, a FORK-event child, a child with a uffd of its own) and the
 * resuming HELLO. A handshake sets nothing of the process's: it returns a
 * session (struct rm_session) that conn.c adopts. The state kept here is
 * the sequence counter, the /dev/userfaultfd the agent lent us and the
 * handshakes' packet buffers. Nothing here allocates: it runs inside other
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
#include <sys/un.h>
#include <unistd.h>

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

/* No UFFD_FEATURE_EVENT_REMOVE: a REMOVE event blocks the thread that
 * called madvise until the agent reads it, which made every run of an
 * eviction batch (the helper's MADV_DONTNEED) a round trip between two
 * threads, and made the agent's ioctls fail with EAGAIN meanwhile. The
 * program's own drops reach the agent as REGION_ZAP (region.c). */
#define UFFD_FEATURES                                                          \
	(UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |                  \
	 UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP |           \
	 UFFD_FEATURE_THREAD_ID)

static uint32_t g_seq;
static int g_uffd_dev = -1; /* /dev/userfaultfd lent by the agent (UFFD_DEVICE), kept for forks */

/* The next packet's sequence number (replies name it). */
uint32_t rm_next_seq(void) { return __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED); }

int rm_send(int sock, uint16_t type, uint32_t seq, const void *body, uint32_t len, int fd)
{
	return rm_send_fds(sock, type, seq, body, len, &fd, fd >= 0 ? 1 : 0);
}

/* Sends one packet with nfds (0..RMEM_MAX_FDS) descriptors on sock. */
int rm_send_fds(int sock, uint16_t type, uint32_t seq, const void *body, uint32_t len, const int *fds, int nfds)
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
		n = rm_sys(SYS_sendmsg, sock, &m, MSG_NOSIGNAL);
	while (n == -EINTR);
	if (n < 0)
		return (int)n;
	return n == (ssize_t)(sizeof h + len) ? 0 : -EPROTO;
}

/* Receives one packet into buf (RMEM_MAX_PACKET bytes) and checks its
 * header; descriptors (at most RMEM_MAX_FDS) land in fds, *nfds says how
 * many. Returns the body length or -errno. */
int rm_recv(int sock, void *buf, struct rmem_hdr *h, int *fds, int *nfds)
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
		n = rm_sys(SYS_recvmsg, sock, &m, MSG_CMSG_CLOEXEC);
	while (n == -EINTR);
	if (n < 0)
		return (int)n;
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

/* ---- userfaultfds ---- */

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

/* A new userfaultfd of this process: through /dev/userfaultfd, else the
 * system call (both need privileges or the administrator's leave: the
 * device's mode, vm.unprivileged_userfaultfd), else through the device the
 * agent lent us. UFFD_USER_MODE_ONLY, which any user may have, is not
 * used but for tests (RMEM_UFFD_USER_MODE): the kernel's own accesses to
 * our memory (read(2) into a buffer whose pages are in the pool) would
 * fail with EFAULT instead of faulting them in. Returns the fd or -errno. */
static int new_uffd(void)
{
	int fd = -1, e = EPERM;
	if (uffd_user_mode()) {
		fd = (int)rm_sysret(rm_sys(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY, 0, 0));
		return fd >= 0 ? fd : -errno;
	}
	int dev = (int)rm_sysret(rm_sys(SYS_openat, AT_FDCWD, "/dev/userfaultfd", O_RDWR | O_CLOEXEC));
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
		close(dev);
	}
	if (fd < 0)
		fd = (int)rm_sysret(rm_sys(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK, 0, 0));
	if (fd < 0 && g_uffd_dev >= 0)
		fd = ioctl(g_uffd_dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		e = errno;
	return fd >= 0 ? fd : -e;
}

/* A new userfaultfd (new_uffd) with features negotiated. Returns the fd
 * or -errno. */
int rm_uffd_with(uint64_t features)
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

/* ---- the handshake ---- */

/* The handshake's packet buffer (a handshake runs under init_mu, or in a
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
	int err = rm_send(s, type, rm_next_seq(), body, len, fd);
	int n = err ? err : rm_recv(s, g_hs_pkt.buf, h, fds, nfds);
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
 * then goes through FORK_PREPARE and the child's own uffd); in ring mode
 * (RMEM_IN_THREAD) UFFD_FEATURE_SIGBUS: a fault raises SIGBUS in the
 * faulting thread, which posts it to the fault ring (ring.c). s: the agent's
 * socket, for UFFD_DEVICE. Returns the fd or -errno with *why set. */
static int open_uffd(int s, uint64_t *features, const char **why)
{
	uint64_t want = UFFD_FEATURES | (rm_in_thread ? UFFD_FEATURE_SIGBUS : 0);
	int fd = rm_uffd_with(want);
	*why = "cannot create a userfaultfd";
	if ((fd == -EPERM || fd == -EACCES) && g_uffd_dev < 0 && s >= 0 && !uffd_user_mode()) {
		int err = borrow_uffd_device(s, why);
		fd = err ? err : rm_uffd_with(want);
	}
	if (fd == -EPERM) { /* EVENT_FORK needs CAP_SYS_PTRACE */
		want &= ~(uint64_t)UFFD_FEATURE_EVENT_FORK;
		fd = rm_uffd_with(want);
	}
	if (fd < 0) {
		if (fd != -EPERM && fd != -EACCES)
			*why = "userfaultfd lacks the features the shim needs";
		return fd;
	}
	*features = want;
	return fd;
}

/* A socket connected to the agent, with a receive timeout of secs.
 * Returns it or -errno (*why NULL: no agent there). */
static int dial(int secs, const char **why)
{
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0) {
		*why = "socket";
		return -errno;
	}
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	memcpy(a.sun_path, rm_sock_path(), sizeof a.sun_path - 1);
	if (rm_sysret(rm_sys(SYS_connect, s, &a, sizeof a)) != 0) {
		int e = errno;
		close(s);
		*why = NULL;
		return -e;
	}
	/* An agent that accepts but never answers must not hang the program. */
	struct timeval tv = {.tv_sec = secs};
	rm_sys6(SYS_setsockopt, s, SOL_SOCKET, SO_RCVTIMEO, (long)&tv, sizeof tv, 0);
	return s;
}

int rm_request_once(uint16_t type, const void *body, uint32_t len)
{
	const char *why;
	int s = dial(120, &why); /* (a HANDOFF may wait for a segment's pages) */
	if (s < 0)
		return s;
	union {
		char buf[RMEM_MAX_PACKET];
		uint64_t align;
	} pkt;
	struct rmem_hdr h;
	int n = rm_send(s, type, 1, body, len, -1);
	if (n == 0)
		n = rm_recv(s, pkt.buf, &h, NULL, NULL);
	close(s);
	if (n < 0)
		return n;
	if (h.type == RMEM_ACK)
		return 0;
	if (h.type != RMEM_ERROR || n < 8)
		return -EPROTO;
	struct rmem_error e;
	memcpy(&e, pkt.buf + sizeof h, 8);
	return -(e.err ? (int)e.err : EPERM);
}

static void no_timeout(int s)
{
	struct timeval tv = {0};
	rm_sys6(SYS_setsockopt, s, SOL_SOCKET, SO_RCVTIMEO, (long)&tv, sizeof tv, 0);
}

/* The fault ring in a WELCOME_RING's staging mapping p (slots pages, then
 * the ring): its header is the agent's, written before WELCOME or not yet
 * (zeros); anything else is not a ring we can post to. */
static struct rmem_ring *ring_of(char *p, uint32_t slots)
{
	struct rmem_ring *r = (struct rmem_ring *)(p + (size_t)slots * rm_page);
	uint32_t magic = __atomic_load_n(&r->magic, __ATOMIC_ACQUIRE);
	if (magic == 0 || (magic == RMEM_RING_MAGIC && r->entries == RMEM_RING_ENTRIES))
		return r;
	return NULL;
}

/* Sends HELLO on s (with the uffd fd unless -1) and takes the WELCOME into
 * out: the staging memfd, mapped (with the fault ring after the slots when
 * HELLO asked for it, RMEM_HELLO_RING, and the doorbell), and with
 * child_uffd the uffd the agent sends a FORK-event child. Returns 0 or
 * -errno with *why set; on failure closes what WELCOME brought (not s,
 * not fd). */
static int hello(int s, const struct rmem_hello *hi, int fd, int child_uffd, struct rm_session *out,
		 const char **why)
{
	int fds[RMEM_MAX_FDS], nfds = 0;
	int ring = (hi->flags & RMEM_HELLO_RING) != 0;
	struct rmem_hdr h;
	*why = "no usable reply to HELLO";
	int n = hs_request(s, RMEM_HELLO, hi, sizeof *hi, fd, "agent refused: ", &h, fds, &nfds, why);
	const char *body = g_hs_pkt.buf + sizeof h;
	if (n >= 0 && (h.type != RMEM_WELCOME || n != sizeof(struct rmem_welcome))) {
		*why = "unexpected reply to HELLO";
		n = -EPROTO;
	}
	struct rmem_welcome w;
	size_t len = 0;
	if (n >= 0) {
		memcpy(&w, body, sizeof w);
		int has_uffd = (w.flags & RMEM_WELCOME_UFFD) != 0;
		int want = 1 + has_uffd + ring;
		len = (size_t)w.staging_slots * rm_page + (ring ? RMEM_RING_SIZE : 0);
		struct stat st;
		if (w.staging_slots == 0 || w.staging_slots > RMEM_MAX_STAGING_SLOTS || nfds != want ||
		    (child_uffd && !has_uffd) || !(w.flags & RMEM_WELCOME_RING) != !ring ||
		    rm_sys(SYS_fstat, fds[0], &st, 0) != 0 || (uint64_t)st.st_size < (uint64_t)len) {
			*why = "bad WELCOME (staging area, fault ring or descriptors)";
			n = -EPROTO;
		}
	}
	out->ring = NULL;
	out->doorbell = -1;
	if (n >= 0) {
		void *p = rm_raw_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
		if (p == MAP_FAILED) {
			*why = "mapping the staging area";
			n = -errno;
		} else {
			rm_raw_madvise(p, len, MADV_DONTFORK); /* this process's: no child inherits it (nor its ring) */
			out->staging = p;
			out->slots = w.staging_slots;
			if (ring && !(out->ring = ring_of(p, w.staging_slots))) {
				rm_raw_munmap(p, len);
				*why = "bad WELCOME (the fault ring's header)";
				n = -EPROTO;
			}
		}
	}
	if (n < 0) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return n;
	}
	out->sock = s;
	out->staging_fd = fds[0];
	out->uffd = child_uffd ? fds[1] : fd;
	if (!child_uffd && (w.flags & RMEM_WELCOME_UFFD))
		close(fds[1]);
	if (ring)
		out->doorbell = fds[nfds - 1];
	out->min_alloc = w.min_alloc;
	no_timeout(s);
	return 0;
}

/* HELLO; a uffd that raises SIGBUS asks for the fault ring. */
static struct rmem_hello hello_of(pid_t ppid, uint64_t serial, uint64_t features, uint32_t flags)
{
	if (features & UFFD_FEATURE_SIGBUS)
		flags |= RMEM_HELLO_RING;
	flags |= RMEM_HELLO_SHARED;
	return (struct rmem_hello){
		.pid = getpid(),
		.ppid = ppid,
		.fork_serial = serial,
		.features = features,
		.page_size = (uint32_t)rm_page,
		.flags = flags,
		.local_mem = rm_local_mem(),
		.max_slowdown = rm_max_slowdown(),
	};
}

/* A top-level process: connects, makes its uffd (after connecting, so that
 * "no agent" is what a process without an agent hears, whatever its
 * userfaultfd rights) and sends it with HELLO. Returns 0 with *s filled,
 * or -errno with *why set (NULL: no agent). Preconditions: init_mu held. */
int rm_hello_top(struct rm_session *s, const char **why)
{
	int sock = dial(30, why);
	if (sock < 0)
		return sock;
	uint64_t features;
	int fd = open_uffd(sock, &features, why);
	int err = fd;
	if (fd >= 0) {
		struct rmem_hello hi = hello_of(getppid(), 0, features, RMEM_HELLO_UFFD);
		err = hello(sock, &hi, fd, 0, s, why);
		if (err)
			close(fd);
	}
	if (err) {
		close(sock);
		return err;
	}
	s->features = features;
	return 0;
}

/* A fork child whose uffd came with a FORK event (the agent has it, and
 * sends it back with WELCOME): HELLO without a uffd, as the parent's
 * serial-th child. Returns 0 with *s filled, or -errno with *why set.
 * Preconditions: the only thread. */
int rm_hello_fork_event(struct rm_session *s, pid_t parent, uint64_t features, uint64_t serial, const char **why)
{
	int sock = dial(30, why);
	if (sock < 0)
		return sock;
	struct rmem_hello hi = hello_of(parent, serial, features, 0);
	int err = hello(sock, &hi, -1, 1, s, why);
	if (err) {
		close(sock);
		return err;
	}
	s->features = features;
	return 0;
}

/* A fork child without FORK events: makes a uffd with the parent's
 * features, registers the regions it inherited with it and sends it with
 * HELLO, as the parent's serial-th child (paired with its FORK_PREPARE).
 * Returns 0 with *s filled, or -errno with *why set. Preconditions: the
 * only thread. */
int rm_hello_fork_own(struct rm_session *s, pid_t parent, uint64_t features, uint64_t serial, const char **why)
{
	int sock = dial(30, why);
	if (sock < 0)
		return sock;
	int fd = rm_uffd_with(features), err = fd;
	if (fd >= 0)
		err = rm_table_register_all(fd, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
	if (err < 0) {
		*why = "cannot register a userfaultfd of the child's own";
	} else {
		struct rmem_hello hi = hello_of(parent, serial, features, RMEM_HELLO_UFFD);
		err = hello(sock, &hi, fd, 0, s, why);
	}
	if (err) {
		if (fd >= 0)
			close(fd);
		close(sock);
		return err;
	}
	s->features = features;
	return 0;
}

/* ---- the resuming HELLO (resume.c) ---- */

static union {
	char buf[RMEM_MAX_PACKET];
	uint64_t align;
} g_rs_pkt;

/* Receives one reply of the resume on s: its type in *type, -errno on
 * failure. Descriptors that ride along land in fds (up to RMEM_MAX_FDS, *nfds
 * says how many) if fds is not NULL, else are closed. */
static int rs_recv(int s, uint16_t *type, void *body, size_t size, int *fds, int *nfds)
{
	struct rmem_hdr h;
	int n = rm_recv(s, g_rs_pkt.buf, &h, fds, nfds);
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

/* One try at resuming the connection cur with the next agent: connect,
 * HELLO (resume: cur's uffd and staging memfd, the fault ring in it when
 * the uffd raises SIGBUS), WELCOME (with the next agent's doorbell, into
 * *doorbell, in ring mode), the regions again, RESUME_DONE, ACK. Returns
 * the new socket, with *journaled set when the agent found this process's
 * journal, or -errno. Preconditions: the helper thread, while program
 * threads wait for the state to change (rm_conn_wait_resumed); threads
 * waiting on ring entries go on waiting: the next agent serves them. */
int rm_hello_resume(const struct rm_session *cur, int *journaled, int *doorbell)
{
	const char *why;
	*doorbell = -1;
	int s = dial(10, &why);
	if (s < 0)
		return s;
	struct rmem_hello hi = hello_of(getppid(), 0, cur->features, RMEM_HELLO_UFFD | RMEM_HELLO_RESUME);
	int ring = (hi.flags & RMEM_HELLO_RING) != 0;
	int fds[RMEM_MAX_FDS] = {cur->uffd, cur->staging_fd}, nfds = 0;
	struct rmem_welcome w;
	uint16_t type = 0;
	int err = rm_send_fds(s, RMEM_HELLO, rm_next_seq(), &hi, sizeof hi, fds, 2);
	if (!err)
		err = rs_recv(s, &type, &w, sizeof w, fds, &nfds);
	/* (A resuming WELCOME needs no staging memfd: we handed ours over.
	 * The doorbell is the last descriptor, whatever comes before it.) */
	if (!err && (type != RMEM_WELCOME || w.staging_slots != cur->slots || !(w.flags & RMEM_WELCOME_RING) != !ring ||
		     (ring && nfds < 1)))
		err = -EPROTO;
	if (!err && ring)
		*doorbell = fds[--nfds];
	while (nfds > 0)
		close(fds[--nfds]);
	uint32_t n = 0;
	if (!err) {
		*journaled = (w.flags & RMEM_WELCOME_RESUMED) != 0;
		rm_table_lock(); /* the layout changes under req_mu + table_mu */
		for (int i = 0; i < rm_table_count() && !err; i++, n++) {
			struct region r = rm_table_at_locked(i);
			struct rmem_region_add m = {r.id, r.base, r.len, (uint32_t)r.kind, RMEM_REGION_RESUMED};
			err = rm_send(s, RMEM_REGION_ADD, rm_next_seq(), &m, sizeof m, -1);
		}
		rm_table_unlock();
	}
	struct rmem_ack ack;
	struct rmem_resume_done d = {.regions = n};
	if (!err)
		err = rm_send(s, RMEM_RESUME_DONE, rm_next_seq(), &d, sizeof d, -1);
	if (!err)
		err = rs_recv(s, &type, &ack, sizeof ack, NULL, NULL);
	if (!err && type != RMEM_ACK)
		err = -EPROTO;
	if (err) {
		if (*doorbell >= 0)
			close(*doorbell);
		*doorbell = -1;
		close(s);
		return err;
	}
	no_timeout(s);
	return s;
}
