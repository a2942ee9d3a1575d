/* No EFAULT a program did not have before (ring mode): the libc calls
 * that hand the kernel buffers to read or write.
 *
 * In ring mode a kernel access to a missing page returns EFAULT (and so
 * does a kernel write to a clean page installed write-protected): the
 * fault raises no SIGBUS for the shim to serve. Each wrapper here pins the
 * call's buffers (pin.c: the helper evicts none of their pages until the
 * call returns), then makes their pages present from user mode (a read of
 * a byte per page of what the kernel reads; an atomic add of 0 per page of
 * what it writes, which also has a write-protected page made writable),
 * and calls glibc's function. If the call still fails with EFAULT and the
 * call is retry-safe, it touches and calls again: a defence, since nothing
 * should protect a pinned page while the call runs (the helper protects a
 * ring client's victims, after its pins: pager/evict.go's protectDirty;
 * the agent's liveness probe spares its writable pages: pager/loop.go's
 * gone).
 *
 * Retry-safe means that an EFAULT left nothing consumed or done, measured
 * on the kernel's code: a write of any kind copies before it does anything
 * (EFAULT only when nothing was written); so do pread, pwrite, the stat
 * family, getdents64 (the position moves by the entries copied only) and
 * readdir. A read or recv of a regular file, a pipe or a stream socket
 * keeps its data when the copy fails (read returns EFAULT only if nothing
 * was copied); MSG_PEEK keeps it anyway. Not retry-safe, and not retried:
 * a datagram socket's recv (the datagram is dequeued, then dropped) and
 * reads of an eventfd, timerfd, signalfd, inotify or a device (the value
 * is consumed first): there the pin is the whole answer.
 *
 * Outside ring mode, and for the shim's own calls (in_shim), each wrapper
 * is one load, a branch and glibc's function. _FORTIFY_SOURCE builds
 * (Debian's packages) call the __*_chk variants: wrapped too. Not seen:
 * glibc's calls from inside itself (stdio's buffers, scandir's), raw
 * system calls but syscall(3)'s (kwait.c), io_uring. */
#include "rmem.h"

#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* Old binaries' stat (glibc before 2.33): no longer in the headers. */
int __xstat(int, const char *, struct stat *);
int __lxstat(int, const char *, struct stat *);
int __fxstat(int, int, struct stat *);
int __fxstatat(int, int, const char *, struct stat *, int);
int __xstat64(int, const char *, struct stat64 *);
int __lxstat64(int, const char *, struct stat64 *);
int __fxstat64(int, int, struct stat64 *);
int __fxstatat64(int, int, const char *, struct stat64 *, int);
ssize_t __read_chk(int, void *, size_t, size_t);
ssize_t __pread_chk(int, void *, size_t, off_t, size_t);
ssize_t __pread64_chk(int, void *, size_t, off_t, size_t);
ssize_t __recv_chk(int, void *, size_t, size_t, int);
ssize_t __recvfrom_chk(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);

/* glibc's functions behind ours. */
#define REAL(name) real_##name
#define DECL(ret, name, ...)                                                   \
	typedef ret name##_fn(__VA_ARGS__);                                    \
	static name##_fn *real_##name
DECL(ssize_t, read, int, void *, size_t);
DECL(ssize_t, write, int, const void *, size_t);
DECL(ssize_t, pread, int, void *, size_t, off_t);
DECL(ssize_t, pwrite, int, const void *, size_t, off_t);
DECL(ssize_t, readv, int, const struct iovec *, int);
DECL(ssize_t, writev, int, const struct iovec *, int);
DECL(ssize_t, preadv, int, const struct iovec *, int, off_t);
DECL(ssize_t, pwritev, int, const struct iovec *, int, off_t);
DECL(ssize_t, preadv2, int, const struct iovec *, int, off_t, int);
DECL(ssize_t, pwritev2, int, const struct iovec *, int, off_t, int);
DECL(ssize_t, recv, int, void *, size_t, int);
DECL(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *);
DECL(ssize_t, recvmsg, int, struct msghdr *, int);
DECL(ssize_t, send, int, const void *, size_t, int);
DECL(ssize_t, sendto, int, const void *, size_t, int, const struct sockaddr *, socklen_t);
DECL(ssize_t, sendmsg, int, const struct msghdr *, int);
DECL(int, stat, const char *, struct stat *);
DECL(int, lstat, const char *, struct stat *);
DECL(int, fstat, int, struct stat *);
DECL(int, fstatat, int, const char *, struct stat *, int);
DECL(int, statx, int, const char *, int, unsigned, struct statx *);
DECL(int, __xstat, int, const char *, struct stat *);
DECL(int, __lxstat, int, const char *, struct stat *);
DECL(int, __fxstat, int, int, struct stat *);
DECL(int, __fxstatat, int, int, const char *, struct stat *, int);
DECL(ssize_t, getdents64, int, void *, size_t);
DECL(struct dirent *, readdir, DIR *);
DECL(int, readdir_r, DIR *, struct dirent *, struct dirent **);
DECL(ssize_t, __read_chk, int, void *, size_t, size_t);
DECL(ssize_t, __pread_chk, int, void *, size_t, off_t, size_t);
DECL(ssize_t, __recv_chk, int, void *, size_t, size_t, int);
DECL(ssize_t, __recvfrom_chk, int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);

/* By our constructor: a first call may come from a signal handler, where
 * dlsym may not be called. */
__attribute__((constructor)) static void kcall_init(void)
{
	(void)RM_RESOLVE(read); (void)RM_RESOLVE(write); (void)RM_RESOLVE(pread);
	(void)RM_RESOLVE(pwrite); (void)RM_RESOLVE(readv); (void)RM_RESOLVE(writev);
	(void)RM_RESOLVE(preadv); (void)RM_RESOLVE(pwritev); (void)RM_RESOLVE(preadv2);
	(void)RM_RESOLVE(pwritev2); (void)RM_RESOLVE(recv); (void)RM_RESOLVE(recvfrom);
	(void)RM_RESOLVE(recvmsg); (void)RM_RESOLVE(send); (void)RM_RESOLVE(sendto);
	(void)RM_RESOLVE(sendmsg); (void)RM_RESOLVE(stat); (void)RM_RESOLVE(lstat);
	(void)RM_RESOLVE(fstat); (void)RM_RESOLVE(fstatat); (void)RM_RESOLVE(statx);
	(void)RM_RESOLVE(__xstat); (void)RM_RESOLVE(__lxstat); (void)RM_RESOLVE(__fxstat);
	(void)RM_RESOLVE(__fxstatat); (void)RM_RESOLVE(getdents64); (void)RM_RESOLVE(readdir);
	(void)RM_RESOLVE(readdir_r); (void)RM_RESOLVE(__read_chk);
	(void)RM_RESOLVE(__pread_chk); (void)RM_RESOLVE(__recv_chk);
	(void)RM_RESOLVE(__recvfrom_chk);
}

static void add_str(struct rm_bufs *bs, const char *s)
{
	if (s) /* (strlen reads it from user mode: its pages are present now) */
		rm_add(bs, s, strlen(s) + 1, 0);
}

/* The iovec array (read by the kernel) and its buffers. */
static void add_iov(struct rm_bufs *bs, const struct iovec *iov, int n, int write)
{
	if (!iov || n <= 0 || n > 1024)
		return;
	rm_add(bs, iov, (size_t)n * sizeof *iov, 0);
	for (int i = 0; i < n; i++)
		rm_add(bs, iov[i].iov_base, iov[i].iov_len, write);
}

/* What a descriptor is, as the wrappers need to know it (a system call
 * or two: only after an EFAULT, or for a call of more than
 * RM_CALL_CHUNK). */
enum fd_kind { FD_OTHER, FD_FILE, FD_DIR, FD_PIPE, FD_STREAM };
static enum fd_kind fd_kind(int fd)
{
	int e = errno;
	struct stat st;
	enum fd_kind k = FD_OTHER;
	if (rm_sys(SYS_fstat, fd, &st, 0) == 0) {
		if (S_ISREG(st.st_mode)) {
			k = FD_FILE;
		} else if (S_ISDIR(st.st_mode)) {
			k = FD_DIR;
		} else if (S_ISFIFO(st.st_mode)) {
			k = FD_PIPE;
		} else if (S_ISSOCK(st.st_mode)) {
			int type = 0;
			socklen_t l = sizeof type;
			if (rm_sys6(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, (long)&type, (long)&l, 0) == 0 &&
			    type == SOCK_STREAM)
				k = FD_STREAM;
		}
	}
	errno = e;
	return k;
}

/* Whether a read of fd that failed with EFAULT consumed nothing: a regular
 * file, a directory, a pipe, a stream socket. */
static int read_keeps(int fd) { return fd_kind(fd) != FD_OTHER; }

static int recv_keeps(int fd, int flags) { return (flags & MSG_PEEK) || read_keeps(fd); }

/* A read of a regular file that came back short goes on for the rest (a
 * page made unwritable under the call, as above, stops the copy short; one
 * read of a file is no more atomic than two): the program asked for n
 * bytes, and short means the end of the file to many. Costs a read more
 * (and a stat) at the end of a file, in ring mode only. off < 0: at the
 * file's position. */
static ssize_t file_rest(int fd, char *buf, size_t n, ssize_t r, off_t off)
{
	int e = errno;
	struct stat st;
	if (r <= 0 || (size_t)r >= n || rm_sys(SYS_fstat, fd, &st, 0) != 0 || !S_ISREG(st.st_mode))
		return r;
	while ((size_t)r < n) {
		ssize_t more = off < 0 ? real_read(fd, buf + r, n - (size_t)r) : real_pread(fd, buf + r, n - (size_t)r, off + r);
		if (more <= 0)
			break;
		r += more;
	}
	errno = e;
	return r;
}

/* ---- read and write ---- */

/* A read or write through a descriptor this process mapped shared memory
 * through reaches the segment's file, where its evicted pages are holes:
 * the agent releases it first (handoff.c), or refuses (EPERM). */
#define RM_FILE_IO(fd)                                                         \
	do {                                                                   \
		if (rm_fd_watched(fd) && rm_handoff_io(fd) != 0) {             \
			errno = EPERM;                                         \
			return -1;                                             \
		}                                                              \
	} while (0)

/* One call of up to RM_CALL_CHUNK bytes, its buffer pinned (op: what;
 * off: pread's and pwrite's; flags: send's and recv's). */
enum io_op { IO_READ, IO_PREAD, IO_WRITE, IO_PWRITE, IO_RECV, IO_SEND };
static int io_reads(enum io_op op) { return op == IO_READ || op == IO_PREAD || op == IO_RECV; }
static ssize_t io_pinned(enum io_op op, int fd, char *buf, size_t n, off_t off, int flags)
{
	struct rm_bufs bs = {0};
	rm_add(&bs, buf, n, io_reads(op));
	switch (op) {
	case IO_READ:
		return RM_PINNED(&bs, read_keeps(fd), real_read(fd, buf, n));
	case IO_PREAD:
		return RM_PINNED(&bs, 1, real_pread(fd, buf, n, off));
	case IO_WRITE:
		return RM_PINNED(&bs, 1, real_write(fd, buf, n));
	case IO_PWRITE:
		return RM_PINNED(&bs, 1, real_pwrite(fd, buf, n, off));
	case IO_RECV:
		return RM_PINNED(&bs, recv_keeps(fd, flags), real_recv(fd, buf, n, flags));
	default:
		return RM_PINNED(&bs, 1, real_send(fd, buf, n, flags));
	}
}

/* How a big call goes to the kernel a chunk at a time: on a regular file
 * (reads and writes go on for the whole count), a pipe or a stream socket
 * (a read returns one chunk's worth, as a short read; a write goes on), or
 * not at all (a datagram, a device: one call, whatever its size). */
enum chunks { CHUNK_NONE, CHUNK_FILE, CHUNK_STREAM };
static enum chunks chunks_of(int fd)
{
	switch (fd_kind(fd)) {
	case FD_FILE:
		return CHUNK_FILE;
	case FD_PIPE:
	case FD_STREAM:
		return CHUNK_STREAM;
	default:
		return CHUNK_NONE;
	}
}

/* read, pread, write, pwrite, recv or send in ring mode. A buffer is made present and
 * pinned for its call, so a call's buffer must fit in the program's
 * budget beside the rest: one of more than RM_CALL_CHUNK bytes goes to the
 * kernel a chunk at a time (each pinned alone), as a loop of the program
 * would, wherever that keeps the call's meaning: a file's data or a
 * stream's bytes in order, a read of a pipe or socket returning what one
 * chunk got (a short read, which a stream's reader expects; a recv with
 * MSG_WAITALL goes on for the whole count, as it would). A datagram or
 * a device is one call (a pin the budget may bend for: the agent lets a
 * fault through when every victim is pinned). A chunk that fails ends the
 * call with what was done before it, or its error. */
static ssize_t io(enum io_op op, int fd, char *buf, size_t n, off_t off, int flags)
{
	enum chunks k = n > RM_CALL_CHUNK ? chunks_of(fd) : CHUNK_NONE;
	if ((op == IO_RECV || op == IO_SEND) && k != CHUNK_STREAM)
		k = CHUNK_NONE; /* (not a stream socket: one call, as asked) */
	if (k == CHUNK_NONE)
		return io_pinned(op, fd, buf, n, off, flags);
	int whole = k == CHUNK_FILE || !io_reads(op) || (op == IO_RECV && (flags & MSG_WAITALL));
	size_t done = 0;
	while (done < n) {
		size_t c = n - done < RM_CALL_CHUNK ? n - done : RM_CALL_CHUNK;
		ssize_t r = io_pinned(op, fd, buf + done, c, off + (off_t)done, flags);
		if (r < 0)
			return done ? (ssize_t)done : r;
		done += (size_t)r;
		if ((size_t)r < c || !whole)
			break;
	}
	return (ssize_t)done;
}

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(read)(fd, buf, n);
	return file_rest(fd, buf, n, io(IO_READ, fd, buf, n, 0, 0), -1);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call() || n > buflen) /* (glibc's reports the overflow) */
		return RM_RESOLVE(__read_chk)(fd, buf, n, buflen);
	return file_rest(fd, buf, n, io(IO_READ, fd, buf, n, 0, 0), -1);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(write)(fd, buf, n);
	return io(IO_WRITE, fd, (char *)buf, n, 0, 0);
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(pread)(fd, buf, n, off);
	return file_rest(fd, buf, n, io(IO_PREAD, fd, buf, n, off, 0), off);
}
EXPORT ssize_t pread64(int, void *, size_t, off_t) __attribute__((alias("pread")));

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call() || n > buflen) /* (glibc's reports the overflow) */
		return RM_RESOLVE(__pread_chk)(fd, buf, n, off, buflen);
	return file_rest(fd, buf, n, io(IO_PREAD, fd, buf, n, off, 0), off);
}
EXPORT ssize_t __pread64_chk(int, void *, size_t, off_t, size_t) __attribute__((alias("__pread_chk")));

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(pwrite)(fd, buf, n, off);
	return io(IO_PWRITE, fd, (char *)buf, n, off, 0);
}
EXPORT ssize_t pwrite64(int, const void *, size_t, off_t) __attribute__((alias("pwrite")));

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(readv)(fd, iov, cnt);
	struct rm_bufs bs = {0};
	add_iov(&bs, iov, cnt, 1);
	return RM_PINNED(&bs, read_keeps(fd), real_readv(fd, iov, cnt));
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(writev)(fd, iov, cnt);
	struct rm_bufs bs = {0};
	add_iov(&bs, iov, cnt, 0);
	return RM_PINNED(&bs, 1, real_writev(fd, iov, cnt));
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(preadv)(fd, iov, cnt, off);
	struct rm_bufs bs = {0};
	add_iov(&bs, iov, cnt, 1);
	return RM_PINNED(&bs, 1, real_preadv(fd, iov, cnt, off));
}
EXPORT ssize_t preadv64(int, const struct iovec *, int, off_t) __attribute__((alias("preadv")));

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(pwritev)(fd, iov, cnt, off);
	struct rm_bufs bs = {0};
	add_iov(&bs, iov, cnt, 0);
	return RM_PINNED(&bs, 1, real_pwritev(fd, iov, cnt, off));
}
EXPORT ssize_t pwritev64(int, const struct iovec *, int, off_t) __attribute__((alias("pwritev")));

/* preadv2 at offset -1 reads at the file position: as read. */
EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(preadv2)(fd, iov, cnt, off, flags);
	struct rm_bufs bs = {0};
	add_iov(&bs, iov, cnt, 1);
	return RM_PINNED(&bs, off != -1 || read_keeps(fd), real_preadv2(fd, iov, cnt, off, flags));
}
EXPORT ssize_t preadv64v2(int, const struct iovec *, int, off_t, int) __attribute__((alias("preadv2")));

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	RM_FILE_IO(fd);
	if (!rm_ring_call())
		return RM_RESOLVE(pwritev2)(fd, iov, cnt, off, flags);
	struct rm_bufs bs = {0};
	add_iov(&bs, iov, cnt, 0);
	return RM_PINNED(&bs, 1, real_pwritev2(fd, iov, cnt, off, flags));
}
EXPORT ssize_t pwritev64v2(int, const struct iovec *, int, off_t, int) __attribute__((alias("pwritev2")));

/* ---- sockets ---- */

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	if (!rm_ring_call())
		return RM_RESOLVE(recv)(fd, buf, n, flags);
	return io(IO_RECV, fd, buf, n, 0, flags);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	if (!rm_ring_call())
		return RM_RESOLVE(__recv_chk)(fd, buf, n, buflen, flags);
	struct rm_bufs bs = {0};
	rm_add(&bs, buf, n < buflen ? n : buflen, 1);
	return RM_PINNED(&bs, recv_keeps(fd, flags), real___recv_chk(fd, buf, n, buflen, flags));
}

static void add_addr(struct rm_bufs *bs, void *addr, socklen_t *len)
{
	if (addr && len) {
		rm_add(bs, len, sizeof *len, 1);
		rm_add(bs, addr, *len, 1);
	}
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *addr, socklen_t *alen)
{
	if (!rm_ring_call())
		return RM_RESOLVE(recvfrom)(fd, buf, n, flags, addr, alen);
	struct rm_bufs bs = {0};
	rm_add(&bs, buf, n, 1);
	add_addr(&bs, addr, alen);
	return RM_PINNED(&bs, recv_keeps(fd, flags), real_recvfrom(fd, buf, n, flags, addr, alen));
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *addr,
			      socklen_t *alen)
{
	if (!rm_ring_call())
		return RM_RESOLVE(__recvfrom_chk)(fd, buf, n, buflen, flags, addr, alen);
	struct rm_bufs bs = {0};
	rm_add(&bs, buf, n < buflen ? n : buflen, 1);
	add_addr(&bs, addr, alen);
	return RM_PINNED(&bs, recv_keeps(fd, flags), real___recvfrom_chk(fd, buf, n, buflen, flags, addr, alen));
}

/* A msghdr: read by the kernel, and written back (lengths, flags) by
 * recvmsg; its name and control buffers, its iovec. */
static void add_msg(struct rm_bufs *bs, const struct msghdr *m, int write)
{
	if (!m)
		return;
	rm_add(bs, m, sizeof *m, write);
	rm_add(bs, m->msg_name, m->msg_namelen, write);
	rm_add(bs, m->msg_control, m->msg_controllen, write);
	add_iov(bs, m->msg_iov, (int)m->msg_iovlen, write);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	if (!rm_ring_call())
		return RM_RESOLVE(recvmsg)(fd, m, flags);
	struct rm_bufs bs = {0};
	add_msg(&bs, m, 1);
	return RM_PINNED(&bs, recv_keeps(fd, flags), real_recvmsg(fd, m, flags));
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	if (!rm_ring_call())
		return RM_RESOLVE(send)(fd, buf, n, flags);
	return io(IO_SEND, fd, (char *)buf, n, 0, flags);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr, socklen_t alen)
{
	if (!rm_ring_call())
		return RM_RESOLVE(sendto)(fd, buf, n, flags, addr, alen);
	struct rm_bufs bs = {0};
	rm_add(&bs, buf, n, 0);
	rm_add(&bs, addr, alen, 0);
	return RM_PINNED(&bs, 1, real_sendto(fd, buf, n, flags, addr, alen));
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	if (rm_handoff_msgs(m, 1, sizeof *m) != 0) {
		errno = EPERM;
		return -1;
	}
	if (!rm_ring_call())
		return RM_RESOLVE(sendmsg)(fd, m, flags);
	struct rm_bufs bs = {0};
	add_msg(&bs, m, 0);
	return RM_PINNED(&bs, 1, real_sendmsg(fd, m, flags));
}

/* ---- the stat family, directories ---- */

#define STAT_CALL(name, path, out, outlen, call)                               \
	do {                                                                   \
		if (!rm_ring_call())                                              \
			return RM_RESOLVE(name) call;                             \
		struct rm_bufs bs = {0};                                          \
		add_str(&bs, path);                                            \
		rm_add(&bs, out, outlen, 1);                                      \
		return RM_PINNED(&bs, 1, real_##name call);                       \
	} while (0)

EXPORT int stat(const char *p, struct stat *st) { STAT_CALL(stat, p, st, sizeof *st, (p, st)); }
EXPORT int lstat(const char *p, struct stat *st) { STAT_CALL(lstat, p, st, sizeof *st, (p, st)); }
EXPORT int fstat(int fd, struct stat *st) { STAT_CALL(fstat, NULL, st, sizeof *st, (fd, st)); }
EXPORT int fstatat(int dfd, const char *p, struct stat *st, int fl) { STAT_CALL(fstatat, p, st, sizeof *st, (dfd, p, st, fl)); }
EXPORT int statx(int dfd, const char *p, int fl, unsigned mask, struct statx *stx)
{
	STAT_CALL(statx, p, stx, sizeof *stx, (dfd, p, fl, mask, stx));
}
EXPORT int __xstat(int v, const char *p, struct stat *st) { STAT_CALL(__xstat, p, st, sizeof *st, (v, p, st)); }
EXPORT int __lxstat(int v, const char *p, struct stat *st) { STAT_CALL(__lxstat, p, st, sizeof *st, (v, p, st)); }
EXPORT int __fxstat(int v, int fd, struct stat *st) { STAT_CALL(__fxstat, NULL, st, sizeof *st, (v, fd, st)); }
EXPORT int __fxstatat(int v, int dfd, const char *p, struct stat *st, int fl)
{
	STAT_CALL(__fxstatat, p, st, sizeof *st, (v, dfd, p, st, fl));
}
/* The 64 names: struct stat64 is struct stat (x86-64, arm64). */
EXPORT int stat64(const char *p, struct stat64 *st) { return stat(p, (struct stat *)st); }
EXPORT int lstat64(const char *p, struct stat64 *st) { return lstat(p, (struct stat *)st); }
EXPORT int fstat64(int fd, struct stat64 *st) { return fstat(fd, (struct stat *)st); }
EXPORT int fstatat64(int dfd, const char *p, struct stat64 *st, int fl) { return fstatat(dfd, p, (struct stat *)st, fl); }
EXPORT int __xstat64(int v, const char *p, struct stat64 *st) { return __xstat(v, p, (struct stat *)st); }
EXPORT int __lxstat64(int v, const char *p, struct stat64 *st) { return __lxstat(v, p, (struct stat *)st); }
EXPORT int __fxstat64(int v, int fd, struct stat64 *st) { return __fxstat(v, fd, (struct stat *)st); }
EXPORT int __fxstatat64(int v, int dfd, const char *p, struct stat64 *st, int fl)
{
	return __fxstatat(v, dfd, p, (struct stat *)st, fl);
}

EXPORT ssize_t getdents64(int fd, void *buf, size_t n)
{
	if (!rm_ring_call())
		return RM_RESOLVE(getdents64)(fd, buf, n);
	struct rm_bufs bs = {0};
	rm_add(&bs, buf, n, 1);
	return RM_PINNED(&bs, 1, real_getdents64(fd, buf, n));
}

/* readdir reads the directory into the DIR's buffer, which opendir got
 * from malloc (the paged heap, in glibc mode), with glibc's own getdents:
 * the whole DIR is pinned and made present. On EFAULT it returns NULL and
 * the directory's position has not moved. */
static void add_dir(struct rm_bufs *bs, DIR *d) { rm_add(bs, d, malloc_usable_size(d), 1); }

EXPORT struct dirent *readdir(DIR *d)
{
	if (!rm_ring_call())
		return RM_RESOLVE(readdir)(d);
	struct rm_bufs bs = {0};
	add_dir(&bs, d);
	struct rm_pin p;
	rm_bufs_pin(&p, &bs);
	int e = errno;
	struct dirent *r;
	for (int try = 0;; try++) {
		errno = e;
		r = real_readdir(d);
		if (r || errno != EFAULT || try == 3)
			break;
		rm_bufs_touch(&bs);
	}
	rm_pin_end(&p);
	return r;
}
EXPORT struct dirent64 *readdir64(DIR *d) { return (struct dirent64 *)readdir(d); }

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* (readdir_r: programs still call it) */
EXPORT int readdir_r(DIR *d, struct dirent *ent, struct dirent **out)
{
	if (!rm_ring_call())
		return RM_RESOLVE(readdir_r)(d, ent, out);
	struct rm_bufs bs = {0};
	add_dir(&bs, d);
	rm_add(&bs, ent, sizeof *ent, 1);
	rm_add(&bs, out, sizeof *out, 1);
	struct rm_pin p;
	rm_bufs_pin(&p, &bs);
	int r;
	for (int try = 0; (r = real_readdir_r(d, ent, out)) == EFAULT && try < 3; try++)
		rm_bufs_touch(&bs);
	rm_pin_end(&p);
	return r;
}
EXPORT int readdir64_r(DIR *d, struct dirent64 *ent, struct dirent64 **out)
{
	return readdir_r(d, (struct dirent *)ent, (struct dirent **)out);
}
