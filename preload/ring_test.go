package preload

import (
	"strings"
	"testing"
	"time"
)

// ringEnv puts a program in ring mode: its uffd raises SIGBUS and its
// faults come through the fault ring (pager/proto/ring.go).
const ringEnv = "RMEM_IN_THREAD=1"

// bothModes runs f as a program is paged today (subtest uffd: faults
// served through the uffd) and in ring mode (subtest ring: env ringEnv).
// The test agent checks that a ring subtest's clients asked for the ring
// and the others did not (testAgent.Close).
func bothModes(t *testing.T, f func(t *testing.T, env ...string)) {
	t.Run("uffd", func(t *testing.T) { f(t) })
	t.Run("ring", func(t *testing.T) { f(t, ringEnv) })
}

// ringTest reports whether t runs in ring mode (a subtest named ring).
func ringTest(t testing.TB) bool {
	n := t.Name()
	return strings.HasSuffix(n, "/ring") || strings.Contains(n, "/ring/")
}

// TestRingSignals: in ring mode the program's own SIGBUS and SIGSEGV
// handlers, installed after the shim's, still run for faults that are not
// the pager's (a file mapping past its end, a PROT_NONE page, kill), and
// signal() hands the old handler back; SIGBUS is never blocked, so the main
// thread with every signal blocked (and SIGBUS held with sighold) and a
// thread that blocks every signal read evicted pages exactly; a child with
// the default SIGBUS disposition, or SIGBUS ignored, dies of a real bus
// error (testdata/ringsig.c). The same program passes as today's mode.
func TestRingSignals(t *testing.T) {
	bothModes(t, func(t *testing.T, env ...string) {
		needUFFD(t)
		a := newTestAgent(t)
		p := start(t, a.path, []string{"ringsig"}, env...)
		p.Expect("ready")
		const pages = 32 << 20 >> 12
		for _, next := range []string{"blocked main ok", "blocked thread ok", "ok"} {
			evict(t, a, p.Pid(), pages)
			p.Send("g")
			p.Expect(next)
		}
		p.Wait()
		s := a.Stats(p.Pid())
		t.Logf("stats %+v", s)
		if s.Restores < 3*pages {
			t.Errorf("%d pages restored, want the %d the program read three times", s.Restores, 3*pages)
		}
		if len(env) > 0 && s.RingFaults < 3*pages {
			t.Errorf("%d faults through the ring, want %d at least", s.RingFaults, 3*pages)
		}
	})
}

// TestRingSystemCalls: system calls whose buffers lie on evicted pages,
// and on clean pages restored write-protected: exact results, no EFAULT
// (testdata/ringcalls.c: pipes, files, readv/writev, send/recv, sendmsg/
// recvmsg with their headers evicted, a datagram, stat/lstat/statx/fstat
// with the path or the struct evicted, getdents64, readdir with its DIR
// evicted, poll/select/epoll_wait/nanosleep with their arguments evicted, a
// futex on an evicted word, posix_spawn and posix_spawnp with argv, envp
// and file actions evicted, system and popen with their command evicted,
// open and access of an evicted path, pipe and uname into evicted pages,
// fwrite and fread of 64 KiB from and into evicted pages, a
// signal on an alternate stack in the paged heap evicted meanwhile).
// The test agent restores pages write-protected, so every page read back is
// clean and protected: a kernel write into it fails without the shim's
// wrappers.
func TestRingSystemCalls(t *testing.T) {
	bothModes(t, func(t *testing.T, env ...string) {
		needUFFD(t)
		a := newTestAgent(t)
		a.restoreWP.Store(true)
		p := start(t, a.path, []string{"ringcalls", "calls"}, env...)
		p.Expect("ready")
		for {
			evict(t, a, p.Pid(), 1)
			p.Send("g")
			l := p.Expect("")
			if l == "wp ok" {
				break
			}
			if l != "step" && !strings.HasSuffix(l, " ok") {
				t.Fatalf("program said %q; stderr:\n%s", l, p.Stderr.String())
			}
		}
		p.Wait()
		s := a.Stats(p.Pid())
		t.Logf("stats %+v", s)
		if strings.Contains(p.Stderr.String(), "rmem:") {
			t.Errorf("the shim complained: %s", p.Stderr.String())
		}
	})
}

// TestRingChurn: while the test agent evicts every resident page again and
// again, a mutex and a condition variable in the paged heap are handed
// between two threads 20,000 times (futex waits on evicted words), a
// thread does pipe I/O from and into heap buffers (the pins against the
// helper's evictions), and a thread with every signal blocked reads the
// heap (testdata/ringcalls.c churn).
func TestRingChurn(t *testing.T) {
	bothModes(t, func(t *testing.T, env ...string) {
		needUFFD(t)
		a := newTestAgent(t)
		p := start(t, a.path, []string{"ringcalls", "churn"}, env...)
		p.Expect("ready")
		done := make(chan string, 1)
		go func() {
			l, ok := <-p.Lines
			if !ok {
				l = "EOF"
			}
			done <- l
		}()
		// The threads run until the test says go: after churnRounds
		// eviction rounds, however fast the program or the agent is.
		const churnRounds = 20
		evictions, rounds := 0, 0
		deadline := time.After(120 * time.Second)
		for {
			select {
			case l := <-done:
				if l != "ok" {
					t.Fatalf("program said %q; stderr:\n%s", l, p.Stderr.String())
				}
				if rounds < churnRounds {
					t.Fatalf("the program ended after %d eviction rounds, before the test's go", rounds)
				}
				p.Wait()
				s := a.Stats(p.Pid())
				t.Logf("%d pages evicted in %d rounds; stats %+v", evictions, rounds, s)
				if evictions == 0 {
					t.Errorf("no page evicted in %d rounds while the threads ran", rounds)
				}
				return
			case <-time.After(5 * time.Millisecond):
				if rounds >= churnRounds {
					continue
				}
				if n, err := a.Evict(p.Pid()); err == nil {
					evictions += n
					rounds++
				}
				if rounds == churnRounds {
					p.Send("g")
				}
			case <-deadline:
				t.Fatalf("no \"ok\" after 120 s; stderr:\n%s\nthreads:\n%s", p.Stderr.String(), threadDump(int(p.Pid())))
			}
		}
	})
}

// TestAgentRestartDoorbell: the next agent serves a resumed process's
// fault ring from its answer to RESUME_DONE on, and the shim installs that
// agent's doorbell only once it has the answer. This successor answers
// 300 ms late and sleeps on its doorbell whenever the ring is empty (no
// polling), so the program's threads post with the agent ASLEEP while the
// dead agent's eventfd still has the doorbell's number: unless the shim
// rings the new doorbell once it is installed, the threads and the agent
// wait for each other for good.
func TestAgentRestartDoorbell(t *testing.T) {
	t.Run("ring", func(t *testing.T) {
		needUFFD(t)
		a := newTestAgent(t)
		p := start(t, a.path, []string{"blocks"}, ringEnv)
		p.Expect("ready")
		evict(t, a, p.Pid(), 24*640)
		a.Close()
		waitStderr(t, p.Stderr.String, "rmem: lost the agent")
		p.Send("g")
		b := newSuccessorWith(t, a, func(b *testAgent) {
			b.ringSpin.Store(0)
			b.resumeReply = 300 * time.Millisecond
		})
		p.Expect("ok")
		p.Wait()
		s := b.Stats(p.Pid())
		t.Logf("the successor's stats %+v", s)
		if s.RingBells == 0 || s.Restores < 24*640 {
			t.Errorf("stats %+v: want the threads to have rung the doorbell, and every page back", s)
		}
	})
}

// TestAgentRestartWhileWaiting: the agent dies with the program's pages
// evicted, and the program's faults on them wait: in ring mode on the
// fault ring's entries (spinning, then on their futex), otherwise in the
// kernel. The next agent at the same socket takes the process back (a
// resuming HELLO hands it the uffd and the staging memfd, the ring in
// it), with the evicted pages its predecessor left (its journal), posts
// again the entries the dead agent had taken, and serves the waiting
// faults: the program reads every page exactly.
func TestAgentRestartWhileWaiting(t *testing.T) {
	bothModes(t, func(t *testing.T, env ...string) {
		needUFFD(t)
		a := newTestAgent(t)
		p := start(t, a.path, []string{"blocks"}, env...)
		p.Expect("ready")
		evict(t, a, p.Pid(), 24*640)
		a.Close()
		waitStderr(t, p.Stderr.String, "rmem: lost the agent")
		p.Send("g")
		time.Sleep(100 * time.Millisecond) // (the faults wait meanwhile; not a check)
		b := newSuccessor(t, a)
		p.Expect("ok")
		p.Wait()
		s := b.Stats(p.Pid())
		t.Logf("the successor's stats %+v; stderr %s", s, p.Stderr.String())
		if s.Restores < 24*640 || !strings.Contains(p.Stderr.String(), "rmem: resumed with the agent") {
			t.Errorf("stats %+v, stderr %q: want every page back from the successor, which resumed the process", s, p.Stderr.String())
		}
		if len(env) > 0 && s.RingFaults == 0 {
			t.Errorf("stats %+v: want the faults through the ring", s)
		}
	})
}
