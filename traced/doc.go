// Package traced pages the memory of a program the LD_PRELOAD shim cannot
// reach — a statically linked binary, a Go program, anything that maps its
// memory with raw system calls — from outside it, under ptrace. memagent
// run uses it for such programs in uffd mode.
//
// The tracer (Run) starts the program traced and, before its first
// instruction, injects system calls into it:
//   - a page of code (testdata/stub_amd64.S): a syscall/int3 site for
//     further injections, and the parasite's loop;
//   - a shared command page (a memfd both map);
//   - the program's userfaultfd, which the tracer takes (pidfd_getfd) and
//     hands to the agent in a HELLO that speaks for the program
//     (proto.HelloTraced; the agent checks /proc/PID/status's TracerPid);
//   - the parasite: a thread of the program, with every signal blocked,
//     that sleeps on the command page and drops pages with
//     madvise(MADV_DONTNEED) when the tracer asks: an eviction must zap
//     the program's page tables, which only the program itself can;
//   - a seccomp filter that stops mmap, munmap, mremap, brk, madvise and
//     the fork family at the tracer (SECCOMP_RET_TRACE), except when they
//     come from the code page (the tracer's and the parasite's own).
//
// Then it follows the program: a private anonymous writable mapping (mmap,
// brk) of the agent's MinAlloc or more becomes a region (REGION_ADD, then
// UFFDIO_REGISTER from the tracer: registration acts on the address space
// of the uffd's maker); madvise(MADV_DONTNEED/FREE/REMOVE) of a region is
// a REGION_ZAP first, so a dropped page reads back as zeros, never as the
// pool's stale copy (Go's scavenger drops spans all the time); munmap,
// partial mremap and brk shrinking reach the agent as the uffd's UNMAP
// events. The agent serves the faults on the uffd as for any client, and
// its EVICTs are served here: the victims are copied into the staging
// slots with process_vm_readv(2) and dropped by the parasite.
//
// What it does differently: mremap that would move or grow a region
// fails with ENOMEM (as the kernel's does when it finds no room;
// glibc's realloc then copies); forked children are paged on their own
// (FORK_PREPARE, as the shim's without FORK events: the tracer sets the
// child up before it runs); the program is killed with
// its tracer (PTRACE_O_EXITKILL: a private agent's pages die with it), and
// does not outlive an agent's restart; job-control stops (SIGSTOP) do not
// stop a traced program; amd64 only. Its faults take the cross-thread
// path (no shim, no fault ring).
//
// It is not a general ptrace library, and not for programs that run
// under a tracer or a seccomp filter of their own.
package traced
