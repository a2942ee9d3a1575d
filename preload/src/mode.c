/* The process's mode, and this thread's guards: what every call into the
 * shim reads first to know where it goes. alloc.c decides the mode; this
 * file keeps it and is the only one that writes it or the guards. */
#include "rmem.h"

#include <sys/mman.h>

TLS struct rm_guard rm_guard;

/* The mode decided, for every thread (atomic; MODE_UNKNOWN until then). */
static int g_mode;

/* The mode as this image of the process sees it, read by every malloc: a
 * word alone in a MADV_WIPEONFORK page, so that it reads MODE_UNKNOWN in
 * a child forked past fork(3) and its atfork handlers (_Fork(), a raw
 * clone), which did not inherit the heap's regions (fork.c): such a child
 * notices at its first malloc instead of touching them
 * (rm_conn_astray). fork.c writes it back in the children of forks it
 * sees. */
static int g_mode0;
int *rm_modep = &g_mode0;

void rm_shim_enter(void) { rm_guard.in_shim++; }
void rm_shim_leave(void) { rm_guard.in_shim--; }
void rm_set_in_fork(int on) { rm_guard.in_fork = on; }
void rm_set_boot(int on) { rm_guard.boot = on; }

int rm_mode(void) { return __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE); }

/* The mode page, with m on it: this image's view, published before the
 * decision (rm_mode_publish) so that what the deciding thread allocates
 * meanwhile (registering the atfork handlers) is routed by m. Without the
 * page (no MADV_WIPEONFORK), a static word: forked-astray children are
 * then noticed by rm_conn_is_connected only. */
void rm_mode_page_init(int m)
{
	int *pg = rm_raw_mmap(NULL, rm_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (pg != MAP_FAILED && rm_raw_madvise(pg, rm_page, MADV_WIPEONFORK) == 0) {
		*pg = m;
		__atomic_store_n(&rm_modep, pg, __ATOMIC_RELEASE);
	} else {
		if (pg != MAP_FAILED)
			rm_raw_munmap(pg, rm_page);
		g_mode0 = m;
	}
}

/* Whether this image of the process is a child made past fork(3) and its
 * atfork handlers (_Fork(), a raw clone) that has not said so yet: its
 * mode page was wiped. 1: yes; 0: no, the process itself or a child that
 * shares its memory (vfork's), whose shim state is its parent's; -1: no
 * mode page, the caller cannot tell. Signal-safe. */
int rm_mode_astray(void)
{
	int *p = __atomic_load_n(&rm_modep, __ATOMIC_ACQUIRE);
	if (p == &g_mode0)
		return -1;
	return *p != rm_mode();
}

/* The decision, for every thread. Preconditions: mode_mu held. */
void rm_mode_publish(int m) { __atomic_store_n(&g_mode, m, __ATOMIC_RELEASE); }

/* In a child: writes the mode back on its (wiped) page; lost_heap: the
 * child has no heap (forked past fork(3) with heap regions). */
void rm_mode_fork_child(int lost_heap)
{
	int m = __atomic_load_n(&g_mode, __ATOMIC_ACQUIRE);
	if (lost_heap && m == MODE_GLIBC) {
		m = MODE_LOST;
		__atomic_store_n(&g_mode, m, __ATOMIC_RELEASE);
	}
	*rm_modep = m;
}
