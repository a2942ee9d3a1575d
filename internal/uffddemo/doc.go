// Package uffddemo is the userfaultfd demonstration behind
// `memagent uffd-demo`: a child process allocates memory (256 MiB by
// default), registers it with userfaultfd and hands the uffd to the parent
// over a Unix socket; it then touches and verifies every page while the
// parent serves every fault with UFFDIO_COPY from a generated pattern. The
// parent prints the number of faults and the p50/p99 fault-to-resume
// latency measured in the child.
//
// # Entry points
//
// The child is the same executable, re-executed with the environment
// variable RMEM_UFFDDEMO_CHILD=1 and the socket as fd 3. A program that
// offers the demo must call MaybeRunChild first thing in main, before
// parsing flags: in the child it runs ChildMain and exits, elsewhere it
// returns at once. Tests do the same in TestMain.
//
// It is NOT part of the paging data path and has no policy worth reusing:
// it is a self-checking demonstration and a smoke test of the userfaultfd
// package on a real kernel (needs root or vm.unprivileged_userfaultfd=1).
//
// # Deadlocks
//
// The parent never touches the child's registered memory; it only copies
// from its own buffer. If the parent dies, the child's faults resume with
// zero pages and the child reports mismatches.
package uffddemo
