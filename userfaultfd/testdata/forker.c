/* forker: the served process of TestForkEvent.
 *
 * usage: forker SOCKET_PATH PAGES
 *
 * Registers an anonymous region with a uffd opened with
 * UFFD_FEATURE_EVENT_FORK, sends the uffd to the test over SOCKET_PATH,
 * waits for 'g', reads the first half of the region (served by the test
 * with generation 0), forks, and then:
 *   child:  checks the first half is inherited (gen 0) and the second half
 *           is served through the child's new uffd with generation 1; then
 *           writes page 0 (copy-on-write) and exits 0 if all was right;
 *   parent: waits for the child, checks the second half is served through
 *           the original uffd with generation 0 and that page 0 does not
 *           show the child's write, and sends the test one status byte
 *           ('0' + child exit status, then '0' + its own mismatch flag).
 * Each word of a page holds pattern(page, gen, word), as in helpers_test.go.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pattern(uint64_t idx, uint64_t gen, uint64_t word) {
	uint64_t x = idx << 32 ^ gen << 56 ^ word ^ 0x9e3779b97f4a7c15ULL;
	x ^= x >> 29;
	return x * 0xbf58476d1ce4e5b9ULL;
}

static long ps;

static int check(char *region, long from, long to, uint64_t gen) {
	int bad = 0;
	for (long i = from; i < to; i++) {
		uint64_t *w = (uint64_t *)(region + i * ps);
		for (long k = 0; k < ps / 8; k++)
			if (w[k] != pattern(i, gen, k)) {
				fprintf(stderr, "forker %d: page %ld word %ld gen %lu wrong\n", getpid(), i, k, (unsigned long)gen);
				bad = 1;
				break;
			}
	}
	return bad;
}

static void die(const char *what) {
	perror(what);
	exit(2);
}

int main(int argc, char **argv) {
	if (argc != 3)
		return 2;
	long pages = atol(argv[2]);
	ps = sysconf(_SC_PAGESIZE);

	int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strncpy(sa.sun_path, argv[1], sizeof(sa.sun_path) - 1);
	if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("connect");

	int uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (uffd < 0)
		die("userfaultfd");
	struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_EVENT_FORK};
	if (ioctl(uffd, UFFDIO_API, &api) < 0)
		die("UFFDIO_API");
	char *region = mmap(NULL, pages * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED)
		die("mmap");
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)region, .len = pages * ps},
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg) < 0)
		die("UFFDIO_REGISTER");

	/* hello: addr, len, features, ioctls, fd (as the Go children send) */
	uint64_t hello[5] = {(uintptr_t)region, pages * ps, UFFD_FEATURE_EVENT_FORK, reg.ioctls, uffd};
	char cbuf[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {.iov_base = hello, .iov_len = sizeof(hello)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &uffd, sizeof(int));
	if (sendmsg(sock, &mh, 0) != sizeof(hello))
		die("sendmsg");

	char c;
	if (read(sock, &c, 1) != 1 || c != 'g')
		die("read go");
	long half = pages / 2;
	int bad = check(region, 0, half, 0);

	pid_t pid = fork(); /* blocks until the test reads the FORK event */
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		bad |= check(region, 0, half, 0);
		bad |= check(region, half, pages, 1);
		region[0] ^= 0xff; /* private: the parent must not see this */
		_exit(bad);
	}
	int status;
	if (waitpid(pid, &status, 0) < 0)
		die("waitpid");
	bad |= check(region, half, pages, 0);
	bad |= check(region, 0, 1, 0);
	char out[2] = {'0' + (WIFEXITED(status) ? WEXITSTATUS(status) : 9), '0' + bad};
	if (write(sock, out, 2) != 2)
		die("write status");
	return 0;
}
