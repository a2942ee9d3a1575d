package swaprun

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"rmem/internal/cgroup"
	"rmem/internal/swaptest"
)

func TestMain(m *testing.M) {
	runHogIfChild()
	goleak.VerifyTestMain(m)
}

func TestParseMountinfo(t *testing.T) {
	in := "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n" +
		"95 22 0:45 / /run/rmem/swap\\040x rw,nosuid,nodev,relatime shared:50 - fuse.rmemswap rmem rw,user_id=0,group_id=0\n"
	got, err := ParseMountinfo([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{{Point: "/", FSType: "ext4"}, {Point: "/run/rmem/swap x", FSType: "fuse.rmemswap"}}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseMountinfo = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"x y z\n", "1 2 3 4 5 6 -\n", "1 2 3 4 5 6 - \n"} {
		if _, err := ParseMountinfo([]byte(bad)); err == nil {
			t.Errorf("ParseMountinfo(%q) accepted", bad)
		}
	}
}

func FuzzParseMountinfo(f *testing.F) {
	f.Add([]byte("22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"))
	f.Add([]byte("1 2 3 4 /a\\0401 6 - fuse.rmemswap x\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := ParseMountinfo(b)
		if err != nil && ms != nil {
			t.Fatal("error with mounts")
		}
		for _, m := range ms {
			if m.FSType == "" {
				t.Fatalf("empty fstype from %q", b)
			}
		}
	})
}

func TestValidate(t *testing.T) {
	for _, o := range []Options{
		{LocalMem: 64 << 20},
		{Command: []string{""}, LocalMem: 64 << 20},
		{Command: []string{"true"}, LocalMem: 1000},
		{Command: []string{"true"}, LocalMem: 64 << 20, SwapSize: 1000},
		{Command: []string{"true"}, LocalMem: 64 << 20, Priority: 40000},
	} {
		if code, err := Run(context.Background(), o); !errors.Is(err, ErrOptions) || code != -1 {
			t.Errorf("Run(%+v) = %d, %v; want -1, ErrOptions", o, code, err)
		}
	}
}

func TestParseState(t *testing.T) {
	st, err := ParseState([]byte(`{"swaps":[{"dir":"/run/rmem/swap-1","pid":42,"start":7,"made":true,"run":7}],` +
		`"runs":[{"pid":7,"start":99,"cgroup":"/sys/fs/cgroup/memory/rmem-run-7"}]}`))
	if err != nil || len(st.Swaps) != 1 || st.Swaps[0] != (OwnedSwap{Dir: "/run/rmem/swap-1", PID: 42, Start: 7, Made: true, Run: 7}) ||
		!slices.Equal(st.Runs, []RunEntry{{PID: 7, Start: 99, Group: "/sys/fs/cgroup/memory/rmem-run-7"}}) {
		t.Fatalf("ParseState = %+v, %v", st, err)
	}
	// The format of earlier versions: runs as bare pids.
	if st, err := ParseState([]byte(`{"swaps":[],"runs":[7,8]}`)); err != nil || !slices.Equal(st.Runs, []RunEntry{{PID: 7}, {PID: 8}}) {
		t.Fatalf("ParseState of bare pids = %+v, %v", st, err)
	}
	if st, err := ParseState(nil); err != nil || len(st.Swaps)+len(st.Runs) != 0 {
		t.Fatalf("empty state: %+v, %v", st, err)
	}
	for _, bad := range []string{`{`, `{"swaps":[{"dir":"rel","pid":1}]}`, `{"swaps":[{"dir":"/x","pid":0}]}`,
		`{"runs":[0]}`, `{"runs":[{"pid":3,"cgroup":"rel"}]}`, `{"runs":["x"]}`} {
		if _, err := ParseState([]byte(bad)); err == nil {
			t.Errorf("ParseState(%s) accepted", bad)
		}
	}
}

// TestAlive: this process runs and started when startOf says; a later
// start time or a pid that is none is not alive (procinfo parses the
// stat line, hostile names included).
func TestAlive(t *testing.T) {
	if !alive(os.Getpid(), startOf(os.Getpid())) || alive(os.Getpid(), startOf(os.Getpid())+1) || alive(1<<22+12345, 0) {
		t.Fatal("alive is wrong about this process or a pid that is none")
	}
}

// TestSharedState: the lock file and the state survive a round trip, and
// runs whose process is gone (or whose pid another process got) are moved
// to dead.
func TestSharedState(t *testing.T) {
	dir := t.TempDir()
	sh, err := lockShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	self := RunEntry{PID: os.Getpid(), Start: startOf(os.Getpid())}
	gone := RunEntry{PID: 1<<22 + 12345}                        // no process
	reused := RunEntry{PID: os.Getpid(), Start: self.Start + 1} // a later process with the same pid
	sh.State.Runs = append(sh.State.Runs, self, gone, reused)
	sh.State.Swaps = append(sh.State.Swaps, OwnedSwap{Dir: "/run/rmem/swap-x", PID: 9, Made: true})
	if err := sh.save(); err != nil {
		t.Fatal(err)
	}
	sh, err = lockShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.unlock()
	if !slices.Equal(sh.State.Runs, []RunEntry{self}) || !slices.Equal(sh.dead, []RunEntry{gone, reused}) || len(sh.State.Swaps) != 1 {
		t.Fatalf("state read back: %+v, dead %+v", sh.State, sh.dead)
	}
}

// TestReapDeadRun injects a run that died leaving its cgroup with a
// process in it, and an rmem-run-PID cgroup of a dead pid that the state
// does not list; Cleanup kills the processes, removes both cgroups, and
// keeps a swap file while a run is live.
func TestReapDeadRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	if _, _, err := cgroup.Detect(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	deadPID := 1<<22 + 4321 // no process
	g, err := cgroup.Create(fmt.Sprintf("rmem-reap-test-%d", os.Getpid()), 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Remove(5 * time.Second) })
	orphan, err := cgroup.Create(fmt.Sprintf("rmem-run-%d", deadPID), 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { orphan.Remove(5 * time.Second) })
	sleep := g.Command("sleep", "100")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sleep.Wait() }()
	for pids, _ := g.Procs(); len(pids) == 0; pids, _ = g.Procs() {
		time.Sleep(5 * time.Millisecond)
	}
	sh, err := lockShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	sh.State.Runs = []RunEntry{{PID: deadPID + 1, Group: g.Path}, {PID: os.Getpid(), Start: startOf(os.Getpid())}}
	sh.State.Swaps = []OwnedSwap{{Dir: "/nonexistent/swap-x", PID: deadPID + 2}}
	if err := sh.save(); err != nil {
		t.Fatal(err)
	}
	c, err := Cleanup(CleanupOptions{RuntimeDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cleaned: %+v", c)
	if err := <-done; err == nil || sleep.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the dead run's process ended with %v, want SIGKILL", err)
	}
	for _, p := range []string{g.Path, orphan.Path} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left: %v", p, err)
		}
	}
	if len(c.Removed) != 2 || !strings.Contains(c.Removed[0], g.Path) || !strings.Contains(c.Removed[0], "1 processes killed") ||
		!strings.Contains(c.Removed[1], orphan.Path) {
		t.Errorf("Removed = %q", c.Removed)
	}
	if len(c.Kept) != 1 || !strings.Contains(c.Kept[0], "in use by runs") {
		t.Errorf("Kept = %q, want the swap kept for this live run", c.Kept)
	}
	st, err := lockShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.unlock()
	if len(st.State.Runs) != 1 || len(st.State.Swaps) != 1 || len(st.dead) != 0 {
		t.Errorf("state after Cleanup: %+v, dead %+v", st.State, st.dead)
	}
}

func FuzzParseState(f *testing.F) {
	f.Add([]byte(`{"swaps":[{"dir":"/a","pid":1}],"runs":[1,2]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"runs":[{"pid":3,"start":4,"cgroup":"/a"},5]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseState(b)
		if err != nil {
			return
		}
		for _, s := range st.Swaps {
			if s.PID <= 0 || s.Dir == "" || s.Dir[0] != '/' {
				t.Fatalf("accepted bad entry %+v", s)
			}
		}
		for _, r := range st.Runs {
			if r.PID <= 0 || r.Group != "" && r.Group[0] != '/' {
				t.Fatalf("accepted bad run %+v", r)
			}
		}
	})
}

// TestWatchOOM: a command waiting at its limit with nowhere to swap is
// killed once the grace time has passed.
func TestWatchOOM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	swaptest.Lock(t)
	if b, err := os.ReadFile("/proc/swaps"); err != nil || strings.Count(string(b), "\n") > 1 {
		t.Skip("swap is active: the command would swap instead of waiting under OOM")
	}
	g, err := cgroup.Create(fmt.Sprintf("rmem-swaprun-test-%d", os.Getpid()), 8<<20)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { g.Remove(5 * time.Second) })
	if g.Version != cgroup.V1 {
		t.Skip("the OOM switch is cgroup v1")
	}
	if err := g.SetOOMKill(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan struct{})
	go func() { RoutineWatchOOM(ctx, g, 300*time.Millisecond, nil, zap.NewNop()); close(watched) }()
	start := time.Now()
	cmd := hogCommand(g)
	err = cmd.Run()
	if err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the hog ended with %v, want killed by the OOM killer", err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("killed after %v, before the grace time", waited)
	}
	<-watched
}

// hogEnv makes the test binary a child that writes every page of 64 MiB
// from user space (a read(2) into the buffer would just come back short at
// the limit).
const hogEnv = "RMEM_TEST_HOG"

func runHogIfChild() {
	if os.Getenv(hogEnv) == "" {
		return
	}
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	os.Exit(0)
}

func hogCommand(g *cgroup.Group) *exec.Cmd {
	cmd := g.Command(os.Args[0])
	cmd.Env = append(os.Environ(), hogEnv+"=1")
	return cmd
}

// TestOOMJudge: the watchdog's decision over scripted samples, one every
// 100 ms, with a grace of 1 s and a nudge every 250 ms.
func TestOOMJudge(t *testing.T) {
	p := func(in, out uint64) Progress { return Progress{"pgpgin": in, "pgpgout": out, "swap": 0} }
	for _, c := range []struct {
		name    string
		samples func(i int) OOMSample // sample i, at i*100ms
		n       int
		want    string // the actions taken, one letter per sample: . wait, n nudge, K kill
	}{{
		// The case of issue 18: always under OOM, pages moving every
		// third sample (a program at the pace of a slow swap). Never
		// killed; nudged when a stall reaches 250 ms, which never happens.
		name:    "slow but progressing",
		samples: func(i int) OOMSample { return OOMSample{Under: true, Progress: p(uint64(i/3), uint64(i/3))} },
		n:       60,
		want:    "............................................................",
	}, {
		name:    "stuck: nudged, then killed at the grace time",
		samples: func(i int) OOMSample { return OOMSample{Under: true, Progress: p(5, 5)} },
		n:       12,
		want:    "...n..n..nKK",
	}, {
		// A stall that the first nudge ends: its pages move again.
		name: "stall ended by a nudge",
		samples: func(i int) OOMSample {
			if i <= 4 {
				return OOMSample{Under: true, Progress: p(5, 5)}
			}
			return OOMSample{Under: true, Progress: p(uint64(i), uint64(i))}
		},
		n:    20,
		want: "...n................",
	}, {
		// Not under OOM: running, or waiting for something else.
		name:    "not under OOM, nothing moving",
		samples: func(i int) OOMSample { return OOMSample{Under: i%5 == 4, Progress: p(5, 5)} },
		n:       30,
		want:    "..............................",
	}, {
		// Only one counter moving counts too: swap-ins (pgmajfault).
		name: "only major faults move",
		samples: func(i int) OOMSample {
			return OOMSample{Under: true, Progress: Progress{"pgpgin": 5, "pgmajfault": uint64(i / 2)}}
		},
		n:    30,
		want: "..............................",
	}} {
		t.Run(c.name, func(t *testing.T) {
			j := OOMJudge{Grace: time.Second}
			t0 := time.Unix(1000, 0)
			var got strings.Builder
			for i := range c.n {
				act, _ := j.Step(t0.Add(time.Duration(i)*100*time.Millisecond), c.samples(i))
				got.WriteByte(".nK"[act])
			}
			if got.String() != c.want {
				t.Errorf("actions %s, want %s", got.String(), c.want)
			}
		})
	}
}

func TestProgressOf(t *testing.T) {
	st, err := cgroup.ParseStat([]byte("cache 4096\nrss 8192\nswap 0\npgpgin 10\npgpgout 7\npgfault 99\npgmajfault 3\nwriteback 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := ProgressOf(st)
	want := Progress{"swap": 0, "pgpgin": 10, "pgpgout": 7, "pgmajfault": 3, "writeback": 0}
	if !maps.Equal(got, want) {
		t.Fatalf("ProgressOf = %v, want %v (pgfault moves when a stuck process retries: not progress)", got, want)
	}
	if _, err := cgroup.ParseStat([]byte("cache x\n")); err == nil {
		t.Fatal("ParseStat accepted a bad value")
	}
}
