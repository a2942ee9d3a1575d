/* Writes one packet of each shim-sent type, built from proto.h's structs,
 * each preceded by its length (u32): the Go test decodes them with
 * pager/proto, so the C and Go layouts cannot drift apart. */
#include "../proto.h"
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static void emit(uint16_t type, uint32_t seq, const void *body, uint32_t len)
{
	struct rmem_hdr h = {RMEM_MAGIC, RMEM_VERSION, type, seq, len};
	uint32_t total = (uint32_t)sizeof h + len;
	fwrite(&total, 4, 1, stdout);
	fwrite(&h, sizeof h, 1, stdout);
	fwrite(body, len, 1, stdout);
}

int main(void)
{
	struct rmem_hello hello = {.pid = 1234, .ppid = 1, .fork_serial = 0, .features = 0x147,
				   .page_size = 4096, .flags = RMEM_HELLO_UFFD, .local_mem = 64ull << 20,
				   .max_slowdown = 20000};
	emit(RMEM_HELLO, 1, &hello, sizeof hello);
	struct rmem_region_add add = {.id = 7, .start = 0x7f0000000000ull, .len = 1 << 20, .kind = RMEM_KIND_MMAP};
	emit(RMEM_REGION_ADD, 2, &add, sizeof add);
	struct rmem_region_del del = {.id = 7, .start = 0x7f0000001000ull, .len = 8192};
	emit(RMEM_REGION_DEL, 3, &del, sizeof del);
	struct rmem_evicted ev = {.batch = 1ull << 40, .done = 3, .err = 14};
	emit(RMEM_EVICTED, 4, &ev, sizeof ev);
	struct rmem_evict e = {.batch = 9, .n = 2};
	e.pages[0].addr = 0x1000;
	e.pages[1].addr = 0x3000;
	e.pages[1].slot = 5;
	emit(RMEM_EVICT, 5, &e, 16 + 2 * sizeof e.pages[0]);
	struct rmem_welcome w = {.client_id = 3, .min_alloc = 1 << 20, .staging_slots = 64, .flags = RMEM_WELCOME_UFFD};
	emit(RMEM_WELCOME, 6, &w, sizeof w);
	struct rmem_error er = {.seq = 2, .err = 12};
	memcpy(er.text, "no memory", 9);
	emit(RMEM_ERROR, 7, &er, 8 + 9);
	struct rmem_region_del zap = {.id = 7, .start = 0x7f0000002000ull, .len = 4096};
	emit(RMEM_REGION_ZAP, 8, &zap, sizeof zap);
	struct rmem_evict e2 = {.batch = 10, .n = 1};
	e2.pages[0].addr = 0x5000;
	e2.pages[0].slot = RMEM_NO_SLOT;
	emit(RMEM_EVICT, 9, &e2, 16 + sizeof e2.pages[0]);
	emit(RMEM_UFFD_DEVICE, 10, NULL, 0);
	struct rmem_fork fp = {.serial = 3};
	emit(RMEM_FORK_PREPARE, 11, &fp, sizeof fp);
	struct rmem_fork fd = {.serial = 3, .pid = -11};
	emit(RMEM_FORK_DONE, 12, &fd, sizeof fd);
	struct rmem_hello child = {.pid = 1235, .ppid = 1234, .fork_serial = 3, .features = 0x146,
				   .page_size = 4096, .flags = RMEM_HELLO_UFFD};
	emit(RMEM_HELLO, 13, &child, sizeof child);
	struct rmem_hello back = {.pid = 1236, .ppid = 1, .features = 0x147, .page_size = 4096,
				  .flags = RMEM_HELLO_UFFD | RMEM_HELLO_RESUME};
	emit(RMEM_HELLO, 14, &back, sizeof back);
	struct rmem_region_add again = {.id = 8, .start = 0x7f0000100000ull, .len = 1 << 21, .kind = RMEM_KIND_HEAP,
					.flags = RMEM_REGION_RESUMED};
	emit(RMEM_REGION_ADD, 15, &again, sizeof again);
	struct rmem_resume_done rd = {.regions = 1};
	emit(RMEM_RESUME_DONE, 16, &rd, sizeof rd);
	struct rmem_hello ring = {.pid = 1237, .ppid = 1, .features = 0x1c7, .page_size = 4096,
				  .flags = RMEM_HELLO_UFFD | RMEM_HELLO_RING};
	emit(RMEM_HELLO, 17, &ring, sizeof ring);
	struct rmem_welcome wr = {.client_id = 4, .staging_slots = 64, .flags = RMEM_WELCOME_UFFD | RMEM_WELCOME_RING};
	emit(RMEM_WELCOME, 18, &wr, sizeof wr);
	struct rmem_region_add shared = {.id = 9, .start = 0x7f0000200000ull, .len = 1 << 20, .kind = RMEM_KIND_SHARED};
	emit(RMEM_REGION_ADD, 19, &shared, sizeof shared);
	struct rmem_handoff ho = {.pid = 1238, .flags = RMEM_HANDOFF_EXEC, .n = 2, .fds = {5, 9}};
	emit(RMEM_HANDOFF, 20, &ho, sizeof ho);
	/* The fault ring's layout: u32 words, in the order the Go test
	 * lists them (proto.RingSize, RingEntries, ...). */
	uint32_t ringw[] = {
		RMEM_RING_SIZE, RMEM_RING_ENTRIES, sizeof(struct rmem_ring_entry), RMEM_RING_MAGIC,
		offsetof(struct rmem_ring, magic), offsetof(struct rmem_ring, entries), offsetof(struct rmem_ring, agent),
		offsetof(struct rmem_ring, posted), offsetof(struct rmem_ring, doorbells),
		offsetof(struct rmem_ring, e), offsetof(struct rmem_ring, e[1]),
		offsetof(struct rmem_ring_entry, state), offsetof(struct rmem_ring_entry, waiters),
		offsetof(struct rmem_ring_entry, tid), offsetof(struct rmem_ring_entry, flags),
		offsetof(struct rmem_ring_entry, addr), offsetof(struct rmem_ring_entry, posted),
		RMEM_RING_AWAKE, RMEM_RING_ASLEEP,
		RMEM_RING_FREE, RMEM_RING_CLAIMED, RMEM_RING_POSTED, RMEM_RING_SERVING,
		RMEM_RING_DONE, RMEM_RING_LOST, RMEM_RING_NOT_MINE, RMEM_RING_WRITE,
		RMEM_MAX_FDS,
	};
	uint32_t n = sizeof ringw;
	fwrite(&n, 4, 1, stdout);
	fwrite(ringw, sizeof ringw, 1, stdout);
	return 0;
}
