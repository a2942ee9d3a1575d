/* The code rmem puts into a traced program (traced/stub_amd64.go holds its
 * bytes; TestStubBytes assembles this file and compares). Position
 * independent, no stack, no data of its own: the tracer sets the registers.
 *
 * site: the tracer injects a system call here: it sets rax and the
 * arguments, points rip at site and lets the thread run; the int3 after
 * the syscall stops it again with the result in rax.
 *
 * clone_site: the same for clone(2) of the parasite thread: the parent
 * (rax = the new thread's id) stops at the int3; the new thread (rax = 0)
 * goes to loop.
 *
 * loop: the parasite thread, with r12 = the command page (a MAP_SHARED
 * memfd page the tracer maps too) and r13 = the last command done. It
 * sleeps on the command word (seq, offset 0, a shared futex), and for each
 * new one runs madvise(MADV_DONTNEED) on the n ranges (offset 8) listed
 * from offset 16 ({addr, len} each; the result replaces len), stores
 * seq in the answer word (offset 4) and wakes it. */
	.text
	.globl stub
stub:
site:
	syscall
	int3
clone_site:
	syscall
	test %rax, %rax
	jnz 1f
	jmp loop
1:	int3
loop:
	mov %r12, %rdi
	xor %esi, %esi
	mov %r13d, %edx
	xor %r10d, %r10d
	mov $202, %eax
	syscall
	mov (%r12), %eax
	cmp %r13d, %eax
	je loop
	mov %eax, %r13d
	mov 8(%r12), %r14d
	lea 16(%r12), %r15
2:	test %r14d, %r14d
	jz 3f
	mov (%r15), %rdi
	mov 8(%r15), %rsi
	mov $4, %edx
	mov $28, %eax
	syscall
	mov %rax, 8(%r15)
	add $16, %r15
	dec %r14d
	jmp 2b
3:	mov %r13d, 4(%r12)
	lea 4(%r12), %rdi
	mov $1, %esi
	mov $1, %edx
	mov $202, %eax
	syscall
	jmp loop
