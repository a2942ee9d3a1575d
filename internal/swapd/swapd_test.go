package swapd_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"rmem/internal/metricsrv"
	"rmem/internal/swapd"
	"rmem/internal/swaprun"
	"rmem/pool/client"
	"rmem/pool/pooltest"
	_ "rmem/rdma/tcp"
	"rmem/swapfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const slabSize = 2 << 20

// startPool starts a real pool in process with one memory server and
// returns the coordinator's client.
func startPool(t *testing.T) *client.Client { return pooltest.StartLive(t, 1, slabSize).Client }

func needMount(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE with mount(2) needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
}

// daemon is a Run in the background.
type daemon struct {
	logs *observer.ObservedLogs
	done chan error
}

// start runs the daemon and waits until it serves (its log line says so).
func start(t *testing.T, ctx context.Context, opts swapd.Options) *daemon {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	opts.Log = zap.New(core)
	d := &daemon{logs: logs, done: make(chan error, 1)}
	go func() { d.done <- swapd.Run(ctx, opts) }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default: // a failed test: unmount from outside, which Run obeys
			swapd.Unmount(opts.Dir)
			select {
			case <-d.done:
			case <-time.After(20 * time.Second):
				t.Errorf("Run still serves %s", opts.Dir)
			}
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for len(logs.FilterMessage("serving pool swap file").All()) == 0 {
		select {
		case err := <-d.done:
			t.Fatalf("Run returned before serving: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("not serving after 20s")
		}
	}
	return d
}

// wait returns Run's result, failing the test if it has not returned
// within 20s.
func (d *daemon) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s")
		return nil
	}
}

// running fails the test if Run has returned.
func (d *daemon) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err
		t.Fatalf("Run returned: %v", err)
	default:
	}
}

// eventually waits up to 10s for the log line msg.
func (d *daemon) eventually(t *testing.T, msg string) []observer.LoggedEntry {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if e := d.logs.FilterMessage(msg).All(); len(e) > 0 {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q within 10s", msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freeAddr returns a loopback address no one listens on (for a moment).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// poolEmpty checks that the daemon's lease and slabs are gone.
func poolEmpty(t *testing.T, cl *client.Client) {
	t.Helper()
	st, err := cl.Status(context.Background())
	if err != nil || st.Agents != 0 || st.Slabs != 0 {
		t.Errorf("pool after Run: %+v %v, want no agent and no slab", st, err)
	}
}

// TestRunRefusesWhileInUse: the daemon serves the swap file and its
// metrics; while the file backs a loop device, a stop signal and Unmount
// are refused, saying why, and it keeps serving; once detached, a stop
// signal unmounts it, and its slabs and lease are gone when Run returns.
// The signals are real ones, sent to this process: Run catches them
// once it serves.
func TestRunRefusesWhileInUse(t *testing.T) {
	needMount(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("no losetup:", err)
	}
	cl := startPool(t)
	dir := t.TempDir()
	metrics := freeAddr(t)
	d := start(t, context.Background(), swapd.Options{Dir: dir, Size: 4 << 20, Workers: 2, Pool: cl, MetricsListen: metrics,
		StopSignals: []os.Signal{syscall.SIGUSR1, syscall.SIGUSR2}})
	if e := d.logs.FilterMessage("serving pool swap file").All(); e[0].ContextMap()["redundancy"] != "rep:1" {
		t.Errorf("serving: %v, want rep:1 (one server up)", e[0].ContextMap())
	}

	file := filepath.Join(dir, swapfs.SwapName)
	page := make([]byte, swapfs.BlockSize)
	copy(page, "written through the mount")
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(page, 0); err != nil {
		t.Fatal(err)
	}
	if st, err := cl.Status(context.Background()); err != nil || st.Agents != 1 || st.Slabs != 1 {
		t.Fatalf("pool after a write: %+v %v, want the daemon's lease and one slab", st, err)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "rmem_swapfs_size_bytes 4.194304e+06") {
		t.Errorf("/metrics has no rmem_swapfs_size_bytes of 4MiB:\n%s", body)
	}
	http.DefaultClient.CloseIdleConnections()

	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	detached := false
	t.Cleanup(func() {
		if !detached {
			exec.Command("losetup", "--detach", dev).Run()
		}
	})

	err = swapd.Unmount(dir)
	if !errors.Is(err, swapd.ErrInUse) || !strings.Contains(err.Error(), "attached to "+dev) || !strings.Contains(err.Error(), "memagent swapoff") {
		t.Errorf("Unmount of a swap file attached to %s: %v", dev, err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	refused := d.eventually(t, "refusing to unmount, still serving")
	if f := refused[0].ContextMap(); f["signal"] != syscall.SIGUSR1.String() || !strings.Contains(f["error"].(string), dev) {
		t.Errorf("refusal logged with %v", f)
	}
	d.running(t)
	got := make([]byte, len(page))
	if _, err := f.ReadAt(got, 0); err != nil || string(got) != string(page) {
		t.Fatalf("reading the swap file after the refusal: %v", err)
	}
	f.Close()

	if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --detach: %v: %s", err, out)
	}
	detached = true
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("Run after SIGUSR2: %v", err)
	}
	if f := d.eventually(t, "unmounting")[0].ContextMap(); f["signal"] != syscall.SIGUSR2.String() {
		t.Errorf("unmounting logged with %v", f)
	}
	if f := d.eventually(t, "unmounted")[0].ContextMap(); f["pool_write_bytes"] != uint64(swapfs.BlockSize) {
		t.Errorf("unmounted logged with %v", f)
	}
	if ok, err := swaprun.SwapMounted(dir); ok || err != nil {
		t.Errorf("still mounted after Run: %v %v", ok, err)
	}
	poolEmpty(t, cl)
}

// TestRunStops: the daemon stops when its file system is unmounted from
// outside, and when its context ends.
func TestRunStops(t *testing.T) {
	needMount(t)
	cl := startPool(t)

	dir := t.TempDir()
	d := start(t, context.Background(), swapd.Options{Dir: dir, Size: 1 << 20, Pool: cl, Replicas: 1})
	if err := swapd.Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("Run after an unmount from outside: %v", err)
	}
	poolEmpty(t, cl)

	ctx, cancel := context.WithCancel(context.Background())
	d = start(t, ctx, swapd.Options{Dir: dir, Size: 1 << 20, Pool: cl, Replicas: 1})
	cancel()
	if err := d.wait(t); err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	if f := d.eventually(t, "unmounting")[0].ContextMap(); f["context"] != context.Canceled.Error() {
		t.Errorf("unmounting logged with %v", f)
	}
	if ok, err := swaprun.SwapMounted(dir); ok || err != nil {
		t.Errorf("still mounted after Run: %v %v", ok, err)
	}
	poolEmpty(t, cl)
}

// TestRunMetricsListenError: an address Run cannot listen on is a
// *metricsrv.Error keeping the errno, and what Run started before is undone:
// nothing is mounted, the lease is gone.
func TestRunMetricsListenError(t *testing.T) {
	cl := startPool(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	err = swapd.Run(context.Background(), swapd.Options{Dir: dir, Size: 1 << 20, Pool: cl, Replicas: 1, MetricsListen: ln.Addr().String()})
	var me *metricsrv.Error
	if !errors.As(err, &me) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Run with its metrics address in use: %v", err)
	}
	if ok, err := swaprun.SwapMounted(dir); ok || err != nil {
		t.Errorf("mounted after a failed Run: %v %v", ok, err)
	}
	poolEmpty(t, cl)
}

// TestRunInvalidOptions: options Run cannot start with fail before
// anything starts (no call to the pool), naming the field.
func TestRunInvalidOptions(t *testing.T) {
	good := func() swapd.Options {
		return swapd.Options{Dir: "/nonexistent/swap", Size: 1 << 20, Workers: 4, Pool: &client.Client{}}
	}
	for _, tt := range []struct {
		key  string
		edit func(o *swapd.Options)
	}{
		{"Dir", func(o *swapd.Options) { o.Dir = "relative/dir" }},
		{"Size", func(o *swapd.Options) { o.Size = 0 }},
		{"Size", func(o *swapd.Options) { o.Size = 4097 }},
		{"Workers", func(o *swapd.Options) { o.Workers = 257 }},
		{"Pool", func(o *swapd.Options) { o.Pool = nil }},
		{"Replicas", func(o *swapd.Options) { o.Replicas = -1 }},
	} {
		o := good()
		tt.edit(&o)
		err := swapd.Run(context.Background(), o)
		if !errors.Is(err, swapd.ErrOptions) || !strings.Contains(err.Error(), ": "+tt.key) {
			t.Errorf("%s: Run: %v, want ErrOptions naming %s", tt.key, err, tt.key)
		}
	}
}
