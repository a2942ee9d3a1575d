/* Prints the kernel's struct sizes, field offsets and ioctl numbers for
 * abi_test.go. Definitions newer than the installed headers are skipped. */
#include <stddef.h>
#include <stdio.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>

#define S(t) printf("size %s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("off %s.%s %zu\n", #t, #f, offsetof(struct t, f))
#define I(n) printf("ioctl %s %lu\n", #n, (unsigned long)(n))

int main(void) {
	S(uffdio_api); S(uffdio_range); S(uffdio_register); S(uffdio_copy);
	S(uffdio_zeropage); S(uffdio_writeprotect); S(uffdio_continue); S(uffd_msg);
	O(uffdio_api, features); O(uffdio_api, ioctls);
	O(uffdio_register, mode); O(uffdio_register, ioctls);
	O(uffdio_copy, src); O(uffdio_copy, len); O(uffdio_copy, mode); O(uffdio_copy, copy);
	O(uffdio_zeropage, mode); O(uffdio_zeropage, zeropage);
	O(uffdio_writeprotect, mode);
	O(uffdio_continue, mode); O(uffdio_continue, mapped);
	O(uffd_msg, arg.pagefault.flags); O(uffd_msg, arg.pagefault.address);
	O(uffd_msg, arg.pagefault.feat.ptid); O(uffd_msg, arg.fork.ufd);
	O(uffd_msg, arg.remap.from); O(uffd_msg, arg.remap.to); O(uffd_msg, arg.remap.len);
	O(uffd_msg, arg.remove.start); O(uffd_msg, arg.remove.end);
	I(USERFAULTFD_IOC_NEW);
	I(UFFDIO_API); I(UFFDIO_REGISTER); I(UFFDIO_UNREGISTER); I(UFFDIO_WAKE);
	I(UFFDIO_COPY); I(UFFDIO_ZEROPAGE); I(UFFDIO_WRITEPROTECT); I(UFFDIO_CONTINUE);
#ifdef UFFDIO_MOVE
	S(uffdio_move); O(uffdio_move, mode); O(uffdio_move, move); I(UFFDIO_MOVE);
#endif
#ifdef UFFDIO_POISON
	S(uffdio_poison); O(uffdio_poison, mode); O(uffdio_poison, updated); I(UFFDIO_POISON);
#endif
#ifdef PAGEMAP_SCAN
	S(pm_scan_arg); S(page_region); O(pm_scan_arg, walk_end); O(pm_scan_arg, vec);
	O(pm_scan_arg, return_mask); O(page_region, categories); I(PAGEMAP_SCAN);
#endif
	return 0;
}
