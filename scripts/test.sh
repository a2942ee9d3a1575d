#!/usr/bin/env bash
# make test's suites, in two lanes that run at once on this 2-vCPU machine
# kind, each one package at a time:
#
#   kernel: the kernel tests (userfaultfd, the pager, the shim) with the
#           race detector, then again with GOMAXPROCS=1;
#   system: every other package with the race detector (the daemons'
#           end-to-end tests, the applications, chaos in network
#           namespaces, the unit tests), then every fuzzer.
#
# The lanes share no host-wide state but CPU time: the kernel lane pages
# programs with in-process test agents on temporary sockets, the system
# lane runs real daemons on ports of their own (tests/, tests/apps) and in
# network namespaces (tests/chaos); the swap tests take their own lock.
# tests/apps measures the node (PostgreSQL's test: Shmem, its processes),
# so no other run of real daemons may stand beside it: make test-ring, the
# same suite in ring mode, is run by hand (run beside it in the kernel
# lane, its memory server's pages showed in PostgreSQL's figures).
# Each lane's output goes to a log printed whole when the lane is done (a
# failure is found by its lane's name), then the time of every phase; if
# make test is stopped, the logs so far.
#
# The phases are the Makefile's targets (test-race, test-gomaxprocs1,
# fuzz), run by the lanes with PKGS set to the lane's packages.
#
# Usage: scripts/test.sh KERNEL_PKGS... (make test passes its own, the
# packages test-gomaxprocs1 runs).
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# phase LANE NAME CMD...: runs CMD, recording its time and status.
phase() {
	local lane=$1 name=$2 t0=$SECONDS rc
	shift 2
	echo "=== $lane: $name: $*"
	"$@"
	rc=$?
	echo "=== $lane: $name: exit $rc after $((SECONDS - t0)) s"
	printf '%-7s %-28s %5d s  %s\n' "$lane" "$name" $((SECONDS - t0)) "$([ $rc = 0 ] && echo ok || echo "FAILED ($rc)")" >>"$logs/phases"
	return $rc
}

# The kernel lane's packages, as go list names them, and everything else.
mapfile -t kpkgs < <($GO list "$@")
mapfile -t others < <($GO list ./... | grep -vxF -f <(printf '%s\n' "${kpkgs[@]}"))

lane_kernel() {
	local rc=0
	phase kernel "race" $MAKE --no-print-directory test-race PKGS="${kpkgs[*]}" || rc=1
	phase kernel "GOMAXPROCS=1" $MAKE --no-print-directory test-gomaxprocs1 || rc=1
	return $rc
}

lane_system() {
	local rc=0
	phase system "race" $MAKE --no-print-directory test-race PKGS="${others[*]}" || rc=1
	phase system "fuzz" $MAKE --no-print-directory fuzz || rc=1
	return $rc
}

show() {
	echo "======== lane $1 ========"
	cat "$logs/$1.log"
}

# Stopped (CI's time limit, ^C): each lane is stopped whole (set -m gives
# each a process group of its own; their stdin is /dev/null, as it is for
# a background job without job control), and what the lanes printed so far
# is shown, to find what hung.
stop() {
	trap - INT TERM
	kill -TERM -- -"$kpid" -"$spid" 2>/dev/null
	wait
	show kernel
	show system
	echo "STOPPED by a signal: above is what the lanes printed before"
	exit 130
}

set -m
t0=$SECONDS
lane_kernel </dev/null >"$logs/kernel.log" 2>&1 &
kpid=$!
lane_system </dev/null >"$logs/system.log" 2>&1 &
spid=$!
trap stop INT TERM
# Each lane's log is shown as soon as it ends.
declare -A lane=([$kpid]=kernel [$spid]=system) rc=()
while [ ${#lane[@]} -gt 0 ]; do
	wait -n -p done "${!lane[@]}"
	r=$?
	rc[${lane[$done]}]=$r
	show "${lane[$done]}"
	unset "lane[$done]"
done

echo "======== phases (the lanes ran at once: $((SECONDS - t0)) s in all) ========"
cat "$logs/phases"
if [ "${rc[kernel]}" != 0 ] || [ "${rc[system]}" != 0 ]; then
	echo "FAILED: lane kernel exit ${rc[kernel]}, lane system exit ${rc[system]}"
	exit 1
fi
