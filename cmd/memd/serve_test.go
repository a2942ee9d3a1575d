package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
	"rmem/internal/memdd"
)

// serveOptions runs `memd serve ARGS` as far as reading its flags and
// returns the options the daemon would start with.
func serveOptions(t *testing.T, args ...string) (memdd.Options, error) {
	t.Helper()
	root := &cobra.Command{Use: "memd"}
	app := cli.NewApp("memd", "MEMD", root)
	cmd := newServeCmd(app)
	var opts memdd.Options
	cmd.RunE = func(*cobra.Command, []string) (err error) {
		opts, err = readServeConfig(app)
		return err
	}
	root.AddCommand(cmd)
	root.SetArgs(append([]string{"serve"}, args...))
	return opts, root.Execute()
}

// TestReadServeConfig: the flags as the daemon's options; "off" data planes
// become "", and the defaults under --runtime-dir are filled in.
func TestReadServeConfig(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	dir := t.TempDir()
	run, data := filepath.Join(dir, "run"), filepath.Join(dir, "data")
	config := filepath.Join(dir, "memd.yaml")
	if err := os.WriteFile(config, []byte("slab-size: 2MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := filepath.Join(dir, "run-with-token")
	if err := os.MkdirAll(withToken, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withToken, "token"), []byte("from-the-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() memdd.Options { // fresh groups for each case to edit
		return memdd.Options{
			Listen: defaultListen, NewTokenFile: filepath.Join(run, "token"), SlabSize: 2 << 20, ID: host,
			Coord: &memdd.CoordOptions{DataDir: data, HeartbeatTimeout: 10 * time.Second, SweepInterval: time.Second},
			Server: &memdd.ServerOptions{Capacity: 4 << 20, TCPListen: defaultTCPListen,
				ShmSocket: filepath.Join(run, "memd-data.sock"), ShmOptional: true, HeartbeatInterval: 2 * time.Second, Mlock: true,
				Spin: 50 * time.Microsecond},
		}
	}
	for _, tt := range []struct {
		name string
		args []string
		want func(o *memdd.Options)
	}{
		{"defaults", nil, func(o *memdd.Options) {}},
		{"tcp off, shm asked for", []string{"--tcp-listen", "off", "--shm-socket", "/s.sock"}, func(o *memdd.Options) {
			o.Server.TCPListen, o.Server.ShmSocket, o.Server.ShmOptional = "", "/s.sock", false
		}},
		{"shm off", []string{"--shm-socket", "off"}, func(o *memdd.Options) { o.Server.ShmSocket, o.Server.ShmOptional = "", false }},
		{"no spinning", []string{"--spin", "0"}, func(o *memdd.Options) { o.Server.Spin = -1 }},
		{"coordinator", []string{"--role", "coordinator"}, func(o *memdd.Options) { o.Server, o.ID = nil, "" }},
		{"coordinator on etcd", []string{"--role", "coordinator", "--store", "etcd://e1:2379,e2:2379/pool", "--id", "c1", "--election-ttl", "3s"},
			func(o *memdd.Options) {
				o.Server, o.ID = nil, "c1"
				o.Coord.DataDir, o.Coord.Etcd = "", &memdd.EtcdOptions{Endpoints: []string{"http://e1:2379", "http://e2:2379"}, Prefix: "/pool", MaxTxnOps: 128, ElectionTTL: 3 * time.Second}
			}},
		{"server", []string{"--role", "server", "--coordinator", "http://c:7470", "--token", " t ", "--id", "s1",
			"--advertise-url", "http://s1:7470", "--tcp-advertise", "10.0.0.1:7471", "--failure-domain", "rack1", "--mlock=false",
			"--connect-timeout", "5s"},
			func(o *memdd.Options) {
				o.Coord, o.Server.CoordinatorURL, o.Token, o.NewTokenFile, o.ID = nil, "http://c:7470", "t", "", "s1"
				o.Server.ConnectTimeout = 5 * time.Second
				o.AdvertiseURL, o.Server.TCPAdvertise, o.Server.Domain, o.Server.Mlock = "http://s1:7470", "10.0.0.1:7471", "rack1", false
			}},
		{"token file", []string{"--runtime-dir", withToken}, func(o *memdd.Options) {
			o.Token, o.NewTokenFile, o.Server.ShmSocket = "from-the-file", "", filepath.Join(withToken, "memd-data.sock")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--config", config, "--runtime-dir", run, "--data-dir", data, "--capacity", "4MiB"}, tt.args...)
			got, err := serveOptions(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			want := base()
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("options\n got %s\nwant %s", asJSON(got), asJSON(want))
			}
		})
	}
}

// asJSON shows o with its groups (no TLS configs: they do not marshal).
func asJSON(o memdd.Options) string {
	o.ServerTLS, o.ClientTLS = nil, nil
	b, err := json.Marshal(o)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// TestServeNetworkToken: a control API on a non-loopback address refuses a
// short token and a token file others may read, naming the file and mode.
func TestServeNetworkToken(t *testing.T) {
	dir := t.TempDir()
	run, data := filepath.Join(dir, "run"), filepath.Join(dir, "data")
	long := "0123456789abcdef"
	file := func(name, tok string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(tok+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	shortFile, openFile, groupFile, goodFile := file("short", "abc", 0o600), file("open", long, 0o644), file("group", long, 0o640), file("good", long, 0o600)
	for _, tt := range []struct {
		name string
		args []string
		want []string // in the error; none: accepted
	}{
		{"short token", []string{"--listen", "0.0.0.0:7470", "--token", "x"}, []string{"token", "at least 16 bytes", "has 1"}},
		{"short token in a file", []string{"--listen", "10.1.2.3:7470", "--token-file", shortFile}, []string{"token-file", shortFile, "has 3"}},
		{"world-readable token file", []string{"--listen", "0.0.0.0:7470", "--token-file", openFile}, []string{"token-file", openFile, "mode 0644", "chmod 600"}},
		{"group-readable token file", []string{"--listen", "[::]:7470", "--token-file", groupFile}, []string{groupFile, "mode 0640"}},
		{"good token file", []string{"--listen", "0.0.0.0:7470", "--token-file", goodFile}, nil},
		{"16 bytes", []string{"--listen", "0.0.0.0:7470", "--token", long}, nil},
		{"short token on loopback", []string{"--listen", "127.0.0.1:7470", "--token", "x"}, nil},
		{"open token file on loopback", []string{"--listen", "127.0.0.1:7470", "--token-file", openFile}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--runtime-dir", run, "--data-dir", data, "--capacity", "4MiB", "--slab-size", "2MiB"}, tt.args...)
			_, err := serveOptions(t, args...)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
