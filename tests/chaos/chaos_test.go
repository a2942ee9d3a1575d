package chaos

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/pool"
	"rmem/tests/chaos/faultproxy"
	"rmem/tests/internal/memdtest"
)

// standard starts the usual cluster: 3 etcd members, 3 coordinators, 3
// memory servers, the agent host.
func standard(t *testing.T, extra ...string) *cluster {
	c := newCluster(t, append([]string{"e1", "e2", "e3", "c1", "c2", "c3", "s1", "s2", "s3", "a1"}, extra...)...)
	c.startEtcd()
	c.startCoordinators(3)
	c.startServers(3)
	return c
}

// TestEtcdChaosLeaderKilled injects kill -9 of the leader coordinator while a
// program pages through the pool (64 MiB heap, 16 MiB local, 2 replicas;
// it allocates more slabs after the kill). It asserts: another
// coordinator leads and answers within newLeaderWithin; the agent's lease
// and every slab it had survive the change; the program prints exactly
// the checksums of a clean run; the agent lost no page.
func TestEtcdChaosLeaderKilled(t *testing.T) {
	needs(t)
	c := standard(t)
	p := c.startProgram(5, c.coordList())
	held := c.holdLease()
	old, err := c.leaderOf("c1")
	if err != nil {
		t.Fatal(err)
	}
	p.release()
	time.Sleep(300 * time.Millisecond) // mid-round
	c.procs[old].Kill()
	leader, took := c.waitLeader(old, newLeaderWithin)
	t.Logf("kill -9 of leader %s: %s leads and answers after %v", old, leader, took.Round(time.Millisecond))
	held.check()
	c.checkServersUp(3)
	lost, elapsed := p.wait()
	c.checkNoSplitBrain()
	t.Logf("program done in %v", elapsed.Round(time.Millisecond))
	record(result{"leader killed", "kill -9 of the leader coordinator mid-run", fmt.Sprintf("new leader answering after %v", took.Round(time.Millisecond)), lost})
}

// TestEtcdChaosLeaderPartitioned injects a partition (nftables drops in the
// leader's namespace) between the leader coordinator and the three etcd
// members, while agents and servers still reach it. It asserts: the old
// leader answers 503 not-leader within the election TTL (it stepped down
// without hearing from etcd), another coordinator leads, the writers'
// terms recorded in etcd's history never interleave (no two leaders
// wrote), the program is exact with no page lost, and once healed the old
// leader is a follower.
func TestEtcdChaosLeaderPartitioned(t *testing.T) {
	needs(t, "nft=nftables")
	c := standard(t)
	p := c.startProgram(5, c.coordList())
	held := c.holdLease()
	old, err := c.leaderOf("c1")
	if err != nil {
		t.Fatal(err)
	}
	p.release()
	time.Sleep(300 * time.Millisecond)
	c.partition(old, "e1", "e2", "e3")
	cut := time.Now()
	// Ask the old leader (which agents and servers still reach) until it
	// refuses: its last answer must come before its lease can have
	// expired on etcd, so before any successor can be elected.
	var down, lastOK time.Duration
	oldCl := c.onFor(-1, old)
	for {
		ctx, cancel := c.ctx()
		_, err := oldCl.Status(ctx)
		cancel()
		if err == nil {
			lastOK = time.Since(cut)
		} else if errors.Is(err, pool.ErrNotLeader) {
			down = time.Since(cut)
			break
		}
		if time.Since(cut) > 3*electionTTL {
			t.Fatalf("%s still not refusing %v after losing etcd: %v", old, time.Since(cut), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	leader, took := c.waitLeader(old, newLeaderWithin)
	t.Logf("%s cut off from etcd: last answered %v later, refused as not the leader %v later; %s leads and answers after %v",
		old, lastOK.Round(time.Millisecond), down.Round(time.Millisecond), leader, took.Round(time.Millisecond))
	if lastOK > electionTTL {
		t.Errorf("the old leader answered %v after losing etcd, later than its lease (%v) allows", lastOK, electionTTL)
	}
	held.check()
	c.checkServersUp(3)
	lost, _ := p.wait()
	c.heal(old)
	memdtest.Eventually(t, 20*time.Second, old+" back as a follower", func() error {
		ctx, cancel := c.ctx()
		defer cancel()
		cv, err := c.on(old).Coordinators(ctx)
		if err != nil {
			return err
		}
		if len(cv.Coordinators) != 3 || cv.Leader == nil || cv.Leader.ID != leader {
			return fmt.Errorf("%+v", cv)
		}
		return nil
	})
	terms := c.checkNoSplitBrain()
	t.Logf("terms that wrote, in etcd's order: %v", terms)
	if len(terms) < 2 || !strings.HasSuffix(terms[len(terms)-1], " "+leader) {
		t.Errorf("terms %v: want the new leader %s's after the old one's", terms, leader)
	}
	record(result{"leader partitioned from etcd", "nftables drop between the leader and 3 etcd members", fmt.Sprintf("stepped down %v, new leader %v", down.Round(time.Millisecond), took.Round(time.Millisecond)), lost})
}

// TestEtcdChaosServerPartitioned injects a partition of the memory server
// holding the most first replicas of the program's slabs (its link
// down), then heals it. It asserts: every slab gets two healthy replicas
// off that server (replicas repaired) while the program runs, the server
// is up again after the heal, and the program is exact with no page lost.
func TestEtcdChaosServerPartitioned(t *testing.T) {
	needs(t)
	c := standard(t)
	p := c.startProgram(5, c.coordList())
	victim := c.busiestServer()
	p.release()
	time.Sleep(300 * time.Millisecond)
	c.linkDown(victim)
	took := c.waitRepaired(victim, 60*time.Second)
	t.Logf("%s partitioned: redundancy restored after %v", victim, took.Round(time.Millisecond))
	c.linkUp(victim)
	back := memdtest.Eventually(t, 30*time.Second, victim+" up again", func() error {
		ctx, cancel := c.ctx()
		defer cancel()
		s, err := c.on(c.coords...).Server(ctx, pool.ServerID(victim))
		if err != nil {
			return err
		}
		if s.State != pool.ServerUp {
			return fmt.Errorf("%s is %s", victim, s.State)
		}
		return nil
	})
	lost, _ := p.wait()
	record(result{"memory server partitioned", "link down of the busiest memory server, then up", fmt.Sprintf("repaired %v, back up %v after heal", took.Round(time.Millisecond), back.Round(time.Millisecond)), lost})
}

// TestEtcdChaosServerPaused injects SIGSTOP of the busiest memory server for
// longer than the heartbeat timeout, then SIGCONT. It asserts: the slabs
// are repaired off it while it is stopped, it is up again after it
// resumes, and the program is exact with no page lost. (Once the
// coordinator freed the migrated replica on the stopped server inside the
// agent's migrated request, which waited out its 10s call timeout while
// the agent's other repairs waited behind it, and the program ended before
// every slab had two replicas again; coord.Migrated now frees behind its
// answer.)
func TestEtcdChaosServerPaused(t *testing.T) {
	needs(t)
	c := standard(t)
	p := c.startProgram(5, c.coordList())
	victim := c.busiestServer()
	p.release()
	time.Sleep(300 * time.Millisecond)
	c.procs[victim].Signal(syscall.SIGSTOP)
	took := c.waitRepaired(victim, 60*time.Second)
	c.procs[victim].Signal(syscall.SIGCONT)
	t.Logf("%s stopped: redundancy restored after %v", victim, took.Round(time.Millisecond))
	lost, _ := p.wait()
	record(result{"memory server paused", "SIGSTOP of the busiest memory server, then SIGCONT", fmt.Sprintf("repaired %v", took.Round(time.Millisecond)), lost})
}

// TestEtcdChaosLossDelay puts the fault proxy (on host px) on every link of
// the agent and the memory servers: the coordinators' control API (they
// advertise the proxy's addresses) and the servers' data plane. A first
// run goes through it without faults, a second with 2ms delay on the
// replies (2ms more per round trip) and 1% of the chunks each way "lost":
// delivered 20ms late, in order, as TCP recovers a lost segment by fast
// retransmit or its tail-loss probe at these round trips. The program is
// smaller here (16 MiB, 4 MiB local, 2 rounds): every remote fault pays
// the delay. It asserts: both runs are exact with no page lost, and the
// proxy did inject the faults.
func TestEtcdChaosLossDelay(t *testing.T) {
	needs(t)
	c := newCluster(t, "e1", "e2", "e3", "c1", "c2", "c3", "s1", "s2", "s3", "a1", "px")
	px := c.nodes["px"]
	var proxies []*faultproxy.Proxy
	port := 9100
	addProxy := func(target string) string {
		port++
		ln, err := listenIn(px.nsPath(), fmt.Sprintf("%s:%d", px.ip, port))
		if err != nil {
			t.Fatal(err)
		}
		fp := faultproxy.New(ln, target, dialIn(px.nsPath()), uint64(port))
		t.Cleanup(func() { fp.Close() })
		proxies = append(proxies, fp)
		return fp.Addr()
	}
	coordAddr, dataAddr := map[string]string{}, map[string]string{}
	for _, id := range []string{"c1", "c2", "c3"} {
		coordAddr[id] = "http://" + addProxy(c.nodes[id].ip+":7480")
	}
	for _, id := range []string{"s1", "s2", "s3"} {
		dataAddr[id] = addProxy(c.nodes[id].ip + ":7481")
	}
	c.coordURL = func(id string) string { return coordAddr[id] }
	c.serverData = func(id string) string { return dataAddr[id] }
	c.startEtcd()
	c.startCoordinators(3)
	c.startServers(3)

	runOnce := func() (int, time.Duration) {
		p := c.startProgramSized(16, 2, c.coordList())
		p.release()
		return p.wait()
	}
	_, clean := runOnce()
	before := sum(proxies)
	loss := faultproxy.Faults{Loss: 0.01, RTO: 20 * time.Millisecond}
	for _, fp := range proxies {
		fp.SetFaultsEach(loss, faultproxy.Faults{Delay: 2 * time.Millisecond, Loss: 0.01, RTO: 20 * time.Millisecond})
	}
	lost, faulty := runOnce()
	st := sum(proxies)
	st.Chunks -= before.Chunks
	st.Lost -= before.Lost
	t.Logf("through the proxy: %v clean, %v with 2ms delay + 1%% loss (%.2fx); %d chunks, %d lost (RTO late)",
		clean.Round(time.Millisecond), faulty.Round(time.Millisecond), faulty.Seconds()/clean.Seconds(), st.Chunks, st.Lost)
	if st.Lost == 0 || st.Chunks == 0 {
		t.Errorf("the proxy injected nothing: %+v", st)
	}
	record(result{"1% loss + 2ms delay (proxy)", "fault proxy on control and data links", fmt.Sprintf("run %v vs %v clean (%.2fx)", faulty.Round(time.Millisecond), clean.Round(time.Millisecond), faulty.Seconds()/clean.Seconds()), lost})
}

func sum(ps []*faultproxy.Proxy) faultproxy.Stats {
	var s faultproxy.Stats
	for _, p := range ps {
		x := p.Stats()
		s.Conns += x.Conns
		s.Chunks += x.Chunks
		s.Lost += x.Lost
		s.Bytes += x.Bytes
	}
	return s
}

// TestEtcdChaosErasureCoded runs the program under --redundancy ec:6+2 on
// eight memory servers. With its heap in the pool (at its gate), two
// servers are killed (kill -9) and two fresh ones join; the agent rebuilds
// the lost shards onto them from the stripes (the time is the table's
// figure). Then bytes are flipped in the donated memory of two servers
// that hold data shards,
// and the program reads and rewrites its heap: exact checksums, no page
// lost, and the bad copies counted (BAD).
func TestEtcdChaosErasureCoded(t *testing.T) {
	needs(t)
	c := newCluster(t, "e1", "e2", "e3", "c1", "c2", "c3", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "a1")
	c.startEtcd()
	c.startCoordinators(3)
	for i := 1; i <= 8; i++ {
		c.startServer(fmt.Sprintf("s%d", i), "128MiB")
	}
	c.waitServersUp(8)
	p := c.startProgramWith(heapMiB, 3, c.coordList(), "--redundancy", "ec:6+2")
	killed := time.Now()
	c.procs["s1"].Kill()
	c.procs["s2"].Kill()
	c.startServer("s9", "128MiB")
	c.startServer("s10", "128MiB")
	memdtest.Eventually(t, 60*time.Second, "the lost shards rebuilt on the new servers", func() error {
		slabs, err := c.leaseSlabs()
		if err != nil {
			return err
		}
		if len(slabs) == 0 {
			return errors.New("the agent holds no slab")
		}
		for _, sl := range slabs {
			if sl.Layout != "ec:6+2" {
				return fmt.Errorf("slab %d is kept as %q", sl.ID, sl.Layout)
			}
			ok := 0
			for _, r := range sl.Replicas {
				if r.Server == "s1" || r.Server == "s2" {
					return fmt.Errorf("slab %d still has shard %d on %s (%s)", sl.ID, r.Shard, r.Server, r.State)
				}
				if r.State == "ok" {
					ok++
				}
			}
			if ok != 8 {
				return fmt.Errorf("slab %d has %d shards ok", sl.ID, ok)
			}
		}
		return nil
	})
	took := time.Since(killed)
	t.Logf("two servers killed: shards rebuilt on two new servers %v after the kill", took.Round(time.Millisecond))
	// Reads go to data shards only (parity is read when one fails), so
	// the bytes are flipped where data shards are: placement decides
	// which servers those are.
	flipped := 0
	for _, id := range c.dataShardServers(2) {
		flipped += memdtest.FlipDonated(t, c.procs[id].Pid())
	}
	p.release()
	lost, elapsed := p.wait()
	bad := statsColumn(t, p.stderr.String(), "BAD")
	if bad == 0 {
		t.Errorf("%d bytes flipped in two servers, and no page read failed its checksum:\n%s", flipped, p.stderr.String())
	}
	t.Logf("program done in %v; %d copies read failed their checksum", elapsed.Round(time.Millisecond), bad)
	record(result{"ec:6+2 on eight servers", "kill -9 of two servers (two new ones join), then bytes flipped in two others",
		fmt.Sprintf("shards rebuilt %v after the kill; %d bad copies repaired", took.Round(100*time.Millisecond), bad), lost})
}
