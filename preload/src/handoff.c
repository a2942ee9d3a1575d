/* Descriptors that leave the agent's sight (HANDOFF): a new program
 * (exec, posix_spawn, system, popen: spawn.c), which may run without the
 * shim, keeps every descriptor that is not close-on-exec; a process at the
 * other end of a socket (sendmsg, sendmmsg with SCM_RIGHTS) may be outside
 * the agent. Either could map a shared memory segment the agent pages
 * without opening it, which the agent's guard (fanotify) does not see, and
 * read its evicted pages as holes. So the shim tells the agent first and
 * waits: the agent brings the segments they reach back into their files
 * (paged no more), or refuses (EPERM) one whose pages the pool lost,
 * which would read as zeros there; the call then fails with EPERM.
 *
 * The same for read(2) and write(2) (kcall.c) through a descriptor this
 * process mapped shared memory through (its creator's, typically): the
 * kernel decided when it was opened, before the segment was paged, that
 * its reads raise no events for the guard, and a read would find the
 * evicted pages as holes, a write would fill one with zeros around its
 * bytes. Once per descriptor and mapping: a released segment stays so.
 * Copies made with dup, dup2 and dup3 are watched too (not fcntl's).
 *
 * Raw system calls are not seen (docs/pager.md, "Shared memory"). */
#include "rmem.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>

/* SCM_MAX_FD: the most descriptors one SCM_RIGHTS message carries. */
#define MAX_PASSED 253

/* How this process speaks to the agent: on its connection; on one of its
 * own, made for the request; or not at all. A process none of whose
 * forebears was connected says nothing: it holds no descriptor of a paged
 * segment that could leave unseen (it opened it, which the guard sees, or
 * received it from a process that said so). One that is not connected
 * itself (a child forked without regions, a child of vfork, whose
 * connection is its parent's) speaks on a connection of its own, and so
 * does every exec: a child about to exec may have closed our socket
 * (CPython's subprocess closes every descriptor it does not pass), and a
 * forked child has no helper thread to read the reply. */
enum { SILENT, ON_CONN, ONCE };
static int g_lineage; /* this process, or one it was forked from, connected */

void rm_handoff_connected(void) { __atomic_store_n(&g_lineage, 1, __ATOMIC_RELAXED); }

static int how(int exec)
{
	if (rm_in_fork())
		return SILENT;
	if (!exec && rm_conn_is_connected())
		return ON_CONN;
	return __atomic_load_n(&g_lineage, __ATOMIC_RELAXED) ? ONCE : SILENT;
}

static pid_t self(void) { return (pid_t)rm_sys(SYS_getpid, 0, 0, 0); }

/* HANDOFF for this process: fds[:n] in requests of up to
 * RMEM_HANDOFF_MAX_FDS, flags with the first. Returns 0, or -EPERM if the
 * agent refuses; any other failure (no agent) is 0: nothing is paged
 * then. */
static int handoff(int way, uint32_t flags, const int *fds, size_t n)
{
	if (way == SILENT)
		return 0;
	rm_shim_enter();
	if (way == ON_CONN)
		rm_req_lock();
	int err;
	size_t i = 0;
	do {
		err = 0;
		struct rmem_handoff m = {.pid = self(), .flags = flags};
		while (i < n && m.n < RMEM_HANDOFF_MAX_FDS)
			m.fds[m.n++] = fds[i++];
		if (way == ON_CONN && rm_conn_state() == ST_CONNECTED)
			err = rm_request_locked(RMEM_HANDOFF, &m, sizeof m);
		if (way == ONCE || (err != 0 && err != -EPERM)) /* (the connection lost meanwhile) */
			err = rm_request_once(RMEM_HANDOFF, &m, sizeof m);
		flags = 0;
	} while (err != -EPERM && i < n);
	if (way == ON_CONN)
		rm_req_unlock();
	rm_shim_leave();
	return err == -EPERM ? -EPERM : 0;
}

int rm_handoff_exec(const int *fds, size_t n)
{
	return rm_in_shim() ? 0 : handoff(how(1), RMEM_HANDOFF_EXEC, fds, n);
}

/* Adds the descriptors m passes (SCM_RIGHTS) to fds[*n..max). */
static void passed(const struct msghdr *m, int *fds, size_t *n, size_t max)
{
	if (!m || !m->msg_control || m->msg_controllen < sizeof(struct cmsghdr))
		return;
	for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)m); c; c = CMSG_NXTHDR((struct msghdr *)m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		const unsigned char *p = CMSG_DATA(c);
		for (size_t j = 0; j < k && *n < max; j++)
			memcpy(&fds[(*n)++], p + j * sizeof(int), sizeof(int));
	}
}

int rm_handoff_msgs(const struct msghdr *m, size_t count, size_t stride)
{
	if (rm_in_shim())
		return 0;
	int fds[MAX_PASSED];
	size_t n = 0;
	for (size_t i = 0; i < count && n < MAX_PASSED; i++)
		passed((const struct msghdr *)((const char *)m + i * stride), fds, &n, MAX_PASSED);
	return n ? handoff(how(0), 0, fds, n) : 0;
}

uint64_t rm_watched_fds[RM_WATCH_FDS / 64];

void rm_watch_fd(int fd)
{
	if ((unsigned)fd < RM_WATCH_FDS)
		__atomic_fetch_or(&rm_watched_fds[fd / 64], 1ull << (fd % 64), __ATOMIC_RELAXED);
}

int rm_handoff_io(int fd)
{
	if (rm_in_shim())
		return 0;
	int err = handoff(how(0), RMEM_HANDOFF_IO, &fd, 1);
	if (!err) /* (released, or no segment of the agent's: reused) */
		__atomic_fetch_and(&rm_watched_fds[fd / 64], ~(1ull << (fd % 64)), __ATOMIC_RELAXED);
	return err;
}

typedef int sendmmsg_fn(int, struct mmsghdr *, unsigned, int);
typedef int dup_fn(int);
typedef int dup2_fn(int, int);
typedef int dup3_fn(int, int, int);
static sendmmsg_fn *real_sendmmsg;
static dup_fn *real_dup;
static dup2_fn *real_dup2;
static dup3_fn *real_dup3;

__attribute__((constructor)) static void handoff_init(void)
{
	(void)RM_RESOLVE(sendmmsg);
	(void)RM_RESOLVE(dup);
	(void)RM_RESOLVE(dup2);
	(void)RM_RESOLVE(dup3);
}

/* A copy of a watched descriptor is watched too. */
static int copied(int fd, int to)
{
	if (to >= 0 && rm_fd_watched(fd))
		rm_watch_fd(to);
	return to;
}

EXPORT int dup(int fd) { return copied(fd, RM_RESOLVE(dup)(fd)); }
EXPORT int dup2(int fd, int to) { return copied(fd, RM_RESOLVE(dup2)(fd, to)); }
EXPORT int dup3(int fd, int to, int flags) { return copied(fd, RM_RESOLVE(dup3)(fd, to, flags)); }

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int vlen, int flags)
{
	if (v && rm_handoff_msgs(&v->msg_hdr, vlen, sizeof *v) != 0) {
		errno = EPERM;
		return -1;
	}
	return RM_RESOLVE(sendmmsg)(fd, v, vlen, flags);
}
