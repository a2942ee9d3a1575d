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
# Each lane's output goes to a log printed whole when both are done (a
# failure is found by its lane's name), then the time of every phase.
#
# Usage: scripts/test.sh KERNEL_PKGS... -- GOMAXPROCS1_SKIP FUZZTIME
# (the Makefile passes them: make test).
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

kernel=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	kernel+=("$1")
	shift
done
shift
skip1=$1 fuzztime=$2

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
mapfile -t kpkgs < <($GO list "${kernel[@]}")
mapfile -t others < <($GO list ./... | grep -vxF -f <(printf '%s\n' "${kpkgs[@]}"))

lane_kernel() {
	local rc=0
	phase kernel "race" $GO test -race -count=1 -p 1 "${kpkgs[@]}" || rc=1
	phase kernel "GOMAXPROCS=1" env GOMAXPROCS=1 $GO test -count=1 -skip "$skip1" "${kpkgs[@]}" || rc=1
	return $rc
}

lane_system() {
	local rc=0
	phase system "race" $GO test -race -count=1 -p 1 "${others[@]}" || rc=1
	phase system "fuzz $fuzztime each" ./scripts/fuzz.sh "$fuzztime" || rc=1
	return $rc
}

t0=$SECONDS
lane_kernel >"$logs/kernel.log" 2>&1 &
kpid=$!
lane_system >"$logs/system.log" 2>&1 &
spid=$!
wait $kpid
krc=$?
wait $spid
src=$?

for lane in kernel system; do
	echo "======== lane $lane ========"
	cat "$logs/$lane.log"
done
echo "======== phases (the lanes ran at once: $((SECONDS - t0)) s in all) ========"
cat "$logs/phases"
if [ $krc != 0 ] || [ $src != 0 ]; then
	echo "FAILED: lane kernel exit $krc, lane system exit $src"
	exit 1
fi
