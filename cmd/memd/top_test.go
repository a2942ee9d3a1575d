package main

import (
	"strings"
	"testing"
	"time"

	"rmem/pool"
)

func TestPoolTopFrame(t *testing.T) {
	at := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
	s := snap{at: at,
		st: pool.Status{Capacity: 4 << 30, Used: 1 << 30, Free: 3 << 30, ServersUp: 2, ServersDown: 1, Agents: 2, AgentsNoRoom: 1,
			Slabs: 16, SlabsHealthy: 15, SlabsDegraded: 1},
		servers: []pool.ServerView{
			{Server: pool.Server{ServerInfo: pool.ServerInfo{ID: "node-a", Domain: "rack1"}, State: pool.ServerUp}, Capacity: 2 << 30, Used: 256 << 20, UsedSlabs: 4, FreeSlabs: 28,
				LastHeartbeat: at.Add(-time.Second), HeartbeatAge: pool.Duration(1200 * time.Millisecond)},
			{Server: pool.Server{ServerInfo: pool.ServerInfo{ID: "node-b"}, State: pool.ServerUp, Draining: true}, Capacity: 2 << 30, Used: 768 << 20, UsedSlabs: 12, FreeSlabs: 20,
				LastHeartbeat: at, HeartbeatAge: pool.Duration(300 * time.Millisecond)},
		},
		leases: []pool.LeaseView{
			{Lease: pool.Lease{ID: "l1", Agent: "memagent@node-a", Node: "node-a", PID: 4242}, Slabs: 8, Bytes: 512 << 20, Used: 300 << 20, NoRoom: true},
			{Lease: pool.Lease{ID: "l2", Agent: "memagent@node-c", Node: "node-c", PID: 77}, Slabs: 8, Bytes: 512 << 20, Used: 500 << 20},
		}}
	out := strings.Join(poolLines(s, 'u'), "\n")
	t.Logf("\n%s", out)
	for _, want := range []string{
		"memd top - 11:00:00  capacity 4.0G  used 1.0G (25.0%)  free 3.0G",
		"servers 2 up, 1 down, 0 unknown, 0 draining; agents 2, 1 waiting for room",
		"slabs 16: 15 healthy, 1 degraded, 0 lost, 0 unknown",
		"SERVER           STATE       CAP   USED   SLABS HEARTBEAT DOMAIN\nnode-b           up,drain   2.0G   768M   12/32     300ms -\nnode-a           up         2.0G   256M    4/32      1.2s rack1",
		"AGENT                    NODE             PID SLABS   HELD   USED\nmemagent@node-c          node-c            77     8   512M   500M\nmemagent@node-a          node-a          4242     8   512M   300M NO ROOM",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks\n%s", want)
		}
	}
	if byName := strings.Join(poolLines(s, 'n'), "\n"); strings.Index(byName, "node-a   ") > strings.Index(byName, "node-b   ") {
		t.Error("by name: node-b before node-a")
	}
}
