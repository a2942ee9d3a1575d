#!/bin/busybox sh
# End to end over Soft-RoCE in the rdma test guest (run by /init, see
# run.sh): a memd memory server whose data plane is verbs on rxe0, a
# memagent paging pagedemo through it with --network verbs, and checks that
# the pages went out and came back over rxe:
#   - pagedemo exits 0 with 0 bad words;
#   - the agent's stats show evictions, write-backs and remote reads;
#   - rxe0's packet counters grew by at least a packet per page moved;
#   - memd's tcp data plane executed no op (rmem_memserver_ops_total counts
#     the ops tcp executes; verbs ops are one-sided, memd never sees them).
# Exits 0 on success, else 1 after printing why and the daemons' logs.
set -u
B=/opt/rmem
IP=${RMEM_VERBS_TEST_ADDR:-10.0.2.15}
MIB=${RMEM_E2E_MIB:-32}
LOCAL=${RMEM_E2E_LOCAL:-8MiB}
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
say() { echo "rdma-vm e2e: $*"; }

memd_pid= agent_pid=
# end PID: SIGTERM, then SIGKILL after 10s.
end() {
	[ -n "$1" ] || return 0
	kill "$1" 2>/dev/null
	i=0
	while kill -0 "$1" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	kill -9 "$1" 2>/dev/null
}
stop() {
	end "$agent_pid"
	end "$memd_pid"
	agent_pid= memd_pid=
}
fail() {
	say "FAIL: $*"
	for f in /tmp/e2e-run.out /tmp/e2e-stats.json /tmp/e2e-run2.out /tmp/e2e-memagent.log /tmp/e2e-memd.log; do
		[ -e "$f" ] || continue
		echo "----- $f (last 60 lines)"
		tail -n 60 "$f"
	done
	stop
	exit 1
}
counter() { cat "$HW/$1" 2>/dev/null || echo -1; }
# json_field NAME: the first "NAME":N in the agent's stats.
json_field() { grep -o "\"$1\": *[0-9]*" /tmp/e2e-stats.json | head -1 | sed 's/.*: *//'; }

start=$(date +%s)
[ -e /dev/userfaultfd ] || fail "no /dev/userfaultfd in the guest (the agent needs it)"
[ -r "$HW/sent_pkts" ] || fail "no rxe0 packet counters at $HW"
# wait_ready PID NAME SECONDS CMD...: until CMD succeeds, while PID lives.
wait_ready() {
	pid=$1 name=$2 secs=$3
	shift 3
	i=0
	until "$@" >/dev/null 2>&1; do
		kill -0 "$pid" 2>/dev/null || fail "$name exited during start-up"
		[ $i -lt $((secs * 10)) ] || fail "$name not ready after ${secs}s"
		sleep 0.1
		i=$((i + 1))
	done
}

mkdir -p /run/rmem /tmp/e2e-memd
sent0=$(counter sent_pkts) rcvd0=$(counter rcvd_pkts)

# memd: both roles, small slabs, the data plane on verbs (tcp stays on
# loopback: the check below shows the agent did not use it).
say "memd serve --verbs-listen $IP:7472"
$B/memd serve --capacity 256MiB --slab-size 2MiB --data-dir /tmp/e2e-memd \
	--verbs-listen "$IP:7472" --shm-socket off --log-format console --log-level info \
	>/tmp/e2e-memd.log 2>&1 &
memd_pid=$!
wait_ready $memd_pid "memd" 60 $B/memd status
$B/memd servers

# The agent as a daemon (its admin socket gives the full stats), and the
# program under memagent run, which uses it.
say "memagent serve --network verbs --local-mem $LOCAL"
$B/memagent serve --network verbs --local-mem "$LOCAL" --log-format console --log-level info \
	>/tmp/e2e-memagent.log 2>&1 &
agent_pid=$!
wait_ready $agent_pid "memagent serve" 30 $B/memagent stats

say "memagent run --stats -- pagedemo $MIB"
t0=$(date +%s)
timeout 120 $B/memagent run --stats -- $B/pagedemo "$MIB" >/tmp/e2e-run.out 2>&1
rc=$?
t1=$(date +%s)
cat /tmp/e2e-run.out
[ $rc = 0 ] || fail "memagent run -- pagedemo exited with $rc (143: killed by the 120s timeout)"
grep -q ": 0 bad words" /tmp/e2e-run.out || fail "pagedemo did not report 0 bad words"

$B/memagent stats --json --all >/tmp/e2e-stats.json || fail "memagent stats failed"
faults=$(json_field faults) evictions=$(json_field evictions) wb=$(json_field write_backs)
reads=$(json_field remote_reads) lost=$(json_field lost)
[ -n "$reads" ] || fail "no stats row for pagedemo"
[ "$evictions" -gt 0 ] || fail "no evictions: pagedemo ($MIB MiB) never exceeded --local-mem $LOCAL"
[ "$wb" -gt 0 ] || fail "no write-backs"
[ "$reads" -gt 0 ] || fail "no remote reads"
[ "$lost" = 0 ] || fail "$lost pages lost"
end "$agent_pid"
agent_pid=

# memagent run on its own, as a user would start it: it starts a private
# agent with these flags for the duration. Its --stats table has no remote
# reads column; 0 bad words after evictions and write-backs says the pages
# came back.
MIB2=$((MIB / 2))
say "memagent run --network verbs --local-mem 4MiB --stats -- pagedemo $MIB2"
t2=$(date +%s)
timeout 120 $B/memagent run --network verbs --local-mem 4MiB --stats --log-level warn -- $B/pagedemo "$MIB2" \
	>/tmp/e2e-run2.out 2>&1
rc=$?
t3=$(date +%s)
cat /tmp/e2e-run2.out
[ $rc = 0 ] || fail "memagent run --network verbs -- pagedemo exited with $rc (143: killed by the 120s timeout)"
grep -q ": 0 bad words" /tmp/e2e-run2.out || fail "pagedemo did not report 0 bad words"
# The columns by the table's header (PID ... EVICTIONS WRITE-BACKS ...).
row=$(awk '$1 == "PID" {for (i = 1; i <= NF; i++) col[$i] = i; next}
	col["EVICTIONS"] && $1 ~ /^[0-9]+$/ {print $col["EVICTIONS"], $col["WRITE-BACKS"]; exit}' /tmp/e2e-run2.out)
[ -n "$row" ] || fail "no stats table row from memagent run --stats"
set -- $row
evictions2=$1 wb2=$2
[ "$evictions2" -gt 0 ] && [ "$wb2" -gt 0 ] || fail "memagent run: evictions $evictions2, write-backs $wb2: want both > 0"

$B/memd servers
metrics=$(wget -qO- http://127.0.0.1:7470/metrics) || fail "memd /metrics unreachable"
tcpops=$(echo "$metrics" | sed -n 's/^rmem_memserver_ops_total \([0-9.e+]*\)$/\1/p')
slabs=$(echo "$metrics" | sed -n 's/^rmem_pool_slabs_allocated_total \([0-9.e+]*\)$/\1/p')
[ -n "$tcpops" ] || fail "no rmem_memserver_ops_total in memd's /metrics"
[ "$tcpops" = 0 ] || fail "memd executed $tcpops ops itself: pages went over tcp, not verbs"
[ "${slabs:-0}" != 0 ] || fail "memd allocated no slab"

sent=$(($(counter sent_pkts) - sent0)) rcvd=$(($(counter rcvd_pkts) - rcvd0))
pages=$((reads + wb + wb2))
[ "$sent" -ge "$pages" ] && [ "$rcvd" -ge "$pages" ] ||
	fail "rxe0 moved too few packets for $pages pages: sent_pkts +$sent, rcvd_pkts +$rcvd"

stop
say "PASS in $(($(date +%s) - start))s; memagent serve + run, pagedemo ${MIB}MiB under ${LOCAL} ($((t1 - t0))s): faults $faults, evictions $evictions, write-backs $wb, remote reads $reads, lost 0, bad words 0; memagent run alone, ${MIB2}MiB under 4MiB ($((t3 - t2))s): evictions $evictions2, write-backs $wb2, bad words 0; memd: $slabs slabs allocated, 0 ops on its tcp data plane; rxe0: sent_pkts +$sent, rcvd_pkts +$rcvd"
