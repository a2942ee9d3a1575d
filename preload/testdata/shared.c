/* Shared memory as regions of kind shared: a MAP_SHARED|MAP_ANONYMOUS
 * mapping, a /dev/shm one (shm_open) and a memfd one, 1 MiB each, beside a
 * private mapping of 1 MiB; "addrs" gives the four. Each is filled, then
 * "ready", and after the test's go (the agent evicted the private memory
 * meanwhile; the shared memory it leaves alone):
 *
 *   - MADV_DONTNEED of the shared mappings keeps their data (the file
 *     holds it), MADV_FREE fails with EINVAL as without the shim, and
 *     MADV_REMOVE of half the /dev/shm mapping punches it (zeros);
 *   - mremap moving or growing a shared mapping fails with ENOMEM and
 *     keeps it; shrinking the memfd one in place works;
 *   - MAP_FIXED private memory over the last quarter of the anonymous one
 *     reads as zeros and is the program's own;
 *   - madvise of a range over a private region and a shared one beside it
 *     treats each piece by its kind;
 *   - a forked child sees the parent's data and the parent the child's
 *     writes;
 *   - munmap of all of it. "ok". */
#include "common.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

static int zeros(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static char *map_fd(int fd)
{
	if (ftruncate(fd, 1 * MiB))
		die("ftruncate");
	char *p = mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap of a shared file");
	close(fd);
	return p;
}

int main(void)
{
	char *anon = mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	char *priv = mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (anon == MAP_FAILED || priv == MAP_FAILED)
		die("mmap");
	char name[64];
	snprintf(name, sizeof name, "/rmem-test-shared-%d", (int)getpid());
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		die("shm_open");
	shm_unlink(name);
	char *shm = map_fd(fd);
	fd = memfd_create("rmem-test-shared", MFD_CLOEXEC);
	if (fd < 0)
		die("memfd_create");
	char *mfd = map_fd(fd);
	printf("addrs %p %p %p %p\n", (void *)anon, (void *)shm, (void *)mfd, (void *)priv);
	fflush(stdout);
	fill(anon, 1 * MiB, 10);
	fill(shm, 1 * MiB, 11);
	fill(mfd, 1 * MiB, 12);
	fill(priv, 1 * MiB, 13);
	say("ready\n");
	wait_go();
	if (!check(priv, 1 * MiB, 13))
		die("private memory after eviction");

	/* Dropping pages of shared memory drops this process's view only. */
	if (madvise(anon, 1 * MiB, MADV_DONTNEED) || madvise(shm, 1 * MiB, MADV_DONTNEED))
		die("madvise MADV_DONTNEED");
	if (!check(anon, 1 * MiB, 10) || !check(shm, 1 * MiB, 11))
		die("shared memory after MADV_DONTNEED");
	errno = 0;
	if (madvise(mfd, 1 * MiB, MADV_FREE) != -1 || errno != EINVAL)
		die("madvise MADV_FREE of shared memory: want EINVAL");
	if (!check(mfd, 1 * MiB, 12))
		die("shared memory after MADV_FREE");
	/* MADV_REMOVE punches the file: zeros, then new data. */
	if (madvise(shm + MiB / 2, MiB / 2, MADV_REMOVE))
		die("madvise MADV_REMOVE");
	if (!check(shm, MiB / 2, 11) || !zeros(shm + MiB / 2, MiB / 2))
		die("shared memory after MADV_REMOVE");
	fill(shm + MiB / 2, MiB / 2, 14);

	/* mremap neither moves nor grows shared memory. */
	errno = 0;
	if (mremap(anon, 1 * MiB, 2 * MiB, MREMAP_MAYMOVE) != MAP_FAILED || errno != ENOMEM)
		die("mremap growing shared memory: want ENOMEM");
	errno = 0;
	if (mremap(shm, 1 * MiB, 1 * MiB, MREMAP_MAYMOVE | MREMAP_FIXED, priv) != MAP_FAILED || errno != ENOMEM)
		die("mremap moving shared memory: want ENOMEM");
	if (!check(anon, 1 * MiB, 10) || !check(shm, MiB / 2, 11) || !check(priv, 1 * MiB, 13))
		die("memory after a refused mremap");
	if (mremap(mfd, 1 * MiB, MiB / 2, 0) != mfd)
		die("mremap shrinking shared memory");
	if (!check(mfd, MiB / 2, 12))
		die("shared memory after shrinking");

	/* MAP_FIXED over the last quarter of the anonymous mapping. */
	char *fixed = mmap(anon + 3 * MiB / 4, MiB / 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
			   -1, 0);
	if (fixed != anon + 3 * MiB / 4)
		die("mmap MAP_FIXED over shared memory");
	if (!zeros(fixed, MiB / 4))
		die("MAP_FIXED over shared memory: not zero");
	fill(fixed, MiB / 4, 15);
	if (!check(anon, 3 * MiB / 4, 10) || !check(fixed, MiB / 4, 15))
		die("memory after MAP_FIXED over shared memory");

	/* A range over a private region and a shared one just after it: each
	 * piece by its kind. MADV_DONTNEED drops the private piece (zeros)
	 * and keeps the shared data; MADV_FREE drops the private piece and
	 * fails on the shared one (EINVAL); MADV_REMOVE fails on the private
	 * piece (EINVAL) before it reaches the shared one. */
	char *mix = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mix == MAP_FAILED || munmap(mix + MiB, MiB))
		die("mmap of the private half");
	char *msh = mmap(mix + MiB, MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (msh != mix + MiB)
		die("mmap of the shared half");
	fill(mix, MiB, 16);
	fill(msh, MiB, 17);
	if (madvise(mix, 2 * MiB, MADV_DONTNEED))
		die("madvise MADV_DONTNEED of private and shared memory");
	if (!zeros(mix, MiB) || !check(msh, MiB, 17))
		die("private and shared memory after MADV_DONTNEED");
	fill(mix, MiB, 18);
	errno = 0;
	if (madvise(mix, 2 * MiB, MADV_FREE) != -1 || errno != EINVAL)
		die("madvise MADV_FREE of private and shared memory: want EINVAL");
	if (!zeros(mix, MiB) || !check(msh, MiB, 17))
		die("private and shared memory after MADV_FREE");
	fill(mix, MiB, 19);
	errno = 0;
	if (madvise(mix, 2 * MiB, MADV_REMOVE) != -1 || errno != EINVAL)
		die("madvise MADV_REMOVE of private and shared memory: want EINVAL");
	if (!check(mix, MiB, 19) || !check(msh, MiB, 17))
		die("private and shared memory after MADV_REMOVE");
	if (munmap(mix, 2 * MiB))
		die("munmap of private and shared memory");

	/* A child sees the parent's data; the parent sees the child's. */
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		if (!check(anon, 3 * MiB / 4, 10) || !check(shm, MiB / 2, 11) || !check(shm + MiB / 2, MiB / 2, 14) ||
		    !check(mfd, MiB / 2, 12) || !check(fixed, MiB / 4, 15))
			die("the child's view of the parent's memory");
		fill(anon, MiB / 2, 20);
		fill(shm, 1 * MiB, 21);
		fill(fixed, MiB / 4, 22); /* private: the parent keeps its own */
		_exit(0);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			die("waitpid");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("child failed");
	if (!check(anon, MiB / 2, 20) || !check(shm, 1 * MiB, 21) || !check(fixed, MiB / 4, 15) ||
	    !check(mfd, MiB / 2, 12))
		die("the parent's view of the child's writes");
	/* Gone: munmap. */
	if (munmap(anon, 1 * MiB) || munmap(shm, 1 * MiB) || munmap(mfd, MiB / 2) || munmap(priv, 1 * MiB))
		die("munmap");
	say("ok\n");
	return 0;
}
