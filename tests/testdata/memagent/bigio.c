/* bigio MIB: system calls whose buffers are larger than the program's
 * budget (memagent run --local-mem, 16 MiB in the tests; MIB is 4x that).
 * In ring mode the shim's wrappers make a call's buffers present and pin
 * them first (a kernel access to a missing page would fail with EFAULT):
 * a buffer the budget cannot hold must neither hang the call (the agent
 * waiting for an eviction that every pin refuses) nor fail it.
 *
 * One write(2) and one pwrite(2) of the whole buffer to a file, one read(2)
 * and one pread(2) of it back, and a thread writing the whole buffer into a
 * pipe with one write(2) while this one reads it with read(2) until done:
 * every byte exact; one fwrite(3) and one fread(3) of it through stdio
 * (which reads and writes big requests in place); and a thread sending it
 * down a stream socket with one send(2) while this one takes it with one
 * recv(2) with MSG_WAITALL. Prints "bigio ok". */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static size_t n;
static unsigned char *src;
static int pfd[2], sfd[2];

static void fail(const char *what)
{
	perror(what);
	exit(1);
}

static unsigned char at(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static void check(const unsigned char *b, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != at(i)) {
			fprintf(stderr, "%s: byte %zu is %u, want %u\n", what, i, b[i], at(i));
			exit(1);
		}
}

static void *writer(void *arg)
{
	(void)arg;
	ssize_t w = write(pfd[1], src, n);
	if (w != (ssize_t)n) {
		fprintf(stderr, "pipe write: %zd of %zu\n", w, n);
		exit(1);
	}
	close(pfd[1]);
	return NULL;
}

static void *sender(void *arg)
{
	(void)arg;
	ssize_t w = send(sfd[1], src, n, 0);
	if (w != (ssize_t)n) {
		fprintf(stderr, "send: %zd of %zu\n", w, n);
		exit(1);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	n = (size_t)atoi(argv[1]) << 20;
	src = malloc(n);
	unsigned char *dst = malloc(n);
	if (!src || !dst)
		fail("malloc");
	for (size_t i = 0; i < n; i++)
		src[i] = at(i);
	char path[] = "/tmp/rmem-bigio-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		fail("mkstemp");
	unlink(path);

	if (write(fd, src, n) != (ssize_t)n)
		fail("write");
	if (lseek(fd, 0, SEEK_SET) != 0)
		fail("lseek");
	memset(dst, 0, n);
	if (read(fd, dst, n) != (ssize_t)n)
		fail("read");
	check(dst, "read");

	if (pwrite(fd, src, n, (off_t)n) != (ssize_t)n)
		fail("pwrite");
	memset(dst, 0, n);
	if (pread(fd, dst, n, (off_t)n) != (ssize_t)n)
		fail("pread");
	check(dst, "pread");
	close(fd);

	FILE *f = tmpfile();
	if (!f)
		fail("tmpfile");
	if (fwrite(src, 1, n, f) != n || fflush(f) != 0)
		fail("fwrite");
	rewind(f);
	memset(dst, 0, n);
	if (fread(dst, 1, n, f) != n)
		fail("fread");
	check(dst, "fread");
	fclose(f);

	if (pipe(pfd) != 0)
		fail("pipe");
	pthread_t th;
	if (pthread_create(&th, NULL, writer, NULL) != 0)
		fail("pthread_create");
	memset(dst, 0, n);
	size_t got = 0;
	for (;;) {
		ssize_t r = read(pfd[0], dst + got, n - got);
		if (r < 0)
			fail("pipe read");
		if (r == 0)
			break;
		got += (size_t)r;
	}
	pthread_join(th, NULL);
	if (got != n) {
		fprintf(stderr, "pipe: %zu bytes of %zu\n", got, n);
		return 1;
	}
	check(dst, "pipe");

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sfd) != 0)
		fail("socketpair");
	if (pthread_create(&th, NULL, sender, NULL) != 0)
		fail("pthread_create");
	memset(dst, 0, n);
	ssize_t r = recv(sfd[0], dst, n, MSG_WAITALL);
	pthread_join(th, NULL);
	if (r != (ssize_t)n) {
		fprintf(stderr, "recv MSG_WAITALL: %zd of %zu\n", r, n);
		return 1;
	}
	check(dst, "socket");
	puts("bigio ok");
	return 0;
}
