// Package apps runs real, unmodified programs from Debian packages under
// `memagent run`, at a quarter or less of their data, and checks each
// against a plain run of the same program: the same output and exit
// status, a peak resident memory (VmHWM) within the budget plus the
// documented margin, and pool space that follows the data (the agent's
// pool held <= 1.1x the program's remote bytes plus one slab, at its
// peak). One program per allocator family: redis-server (libjemalloc.so.2),
// memcached (glibc malloc, 1 MiB slab mallocs), yrmcdsd and swipl
// (libtcmalloc_minimal.so.4), sqlite3 with libmimalloc.so.2 preloaded (no
// Debian program links mimalloc; preloading is how mimalloc is meant to be
// used), sqlite3 and python3 (CPython, glibc malloc with obmalloc arenas).
//
// The tests need root (memagent serves other processes' userfaultfds) and
// the programs (.ci/run installs them); a missing one skips with its
// Debian package's name. They build the project with `make build` once.
package apps
