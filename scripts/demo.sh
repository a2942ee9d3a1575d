#!/usr/bin/env bash
# The main job of the README, end to end on this host: a memd (memory server
# and coordinator, embedded store) and `memagent run` paging a program that
# uses 4x its local-memory budget to the pool, then the paging stats.
# Uses the memd already running on 127.0.0.1:7470 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
SIZE_MIB=${SIZE_MIB:-256}
LOCAL_MEM=${LOCAL_MEM:-64MiB}

if [ "$(id -u)" != 0 ]; then
	echo "demo: needs root (userfaultfd for other processes, mlock of donated memory)" >&2
	exit 1
fi
gcc -O2 -Wall -o "$BIN/pagedemo" examples/pagedemo.c

memd_pid=
cleanup() {
	if [ -n "$memd_pid" ]; then
		kill "$memd_pid" 2>/dev/null || true
		wait "$memd_pid" 2>/dev/null || true
		rm -rf "$data"
	fi
}
trap cleanup EXIT

if ! "$BIN/memd" status >/dev/null 2>&1; then
	data=$(mktemp -d /tmp/rmem-demo.XXXXXX)
	echo "demo: starting memd (1GiB donated, 16MiB slabs, metadata in $data)"
	"$BIN/memd" serve --capacity 1GiB --slab-size 16MiB --data-dir "$data" --log-level warn &
	memd_pid=$!
	for _ in $(seq 100); do
		"$BIN/memd" status >/dev/null 2>&1 && break
		kill -0 "$memd_pid" 2>/dev/null || { echo "demo: memd did not start" >&2; exit 1; }
		sleep 0.1
	done
fi
"$BIN/memd" status
echo
echo "demo: memagent run --local-mem $LOCAL_MEM -- pagedemo $SIZE_MIB   (a $SIZE_MIB MiB heap, 4x the budget)"
"$BIN/memagent" run --local-mem "$LOCAL_MEM" --stats --log-level error -- "$BIN/pagedemo" "$SIZE_MIB"
