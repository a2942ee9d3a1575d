package main

import (
	"os"
	"path/filepath"
	"reflect"
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
	base := memdd.Options{
		Listen: defaultListen, NewTokenFile: filepath.Join(run, "token"), SlabSize: 2 << 20,
		CoordRole: true, DataDir: data, HeartbeatTimeout: 10 * time.Second, SweepInterval: time.Second,
		ServerRole: true, ID: host, Capacity: 4 << 20, TCPListen: defaultTCPListen,
		ShmSocket: filepath.Join(run, "memd-data.sock"), ShmOptional: true, HeartbeatInterval: 2 * time.Second, Mlock: true,
	}
	for _, tt := range []struct {
		name string
		args []string
		want func(o *memdd.Options)
	}{
		{"defaults", nil, func(o *memdd.Options) {}},
		{"tcp off, shm asked for", []string{"--tcp-listen", "off", "--shm-socket", "/s.sock"}, func(o *memdd.Options) {
			o.TCPListen, o.ShmSocket, o.ShmOptional = "", "/s.sock", false
		}},
		{"shm off", []string{"--shm-socket", "off"}, func(o *memdd.Options) { o.ShmSocket, o.ShmOptional = "", false }},
		{"coordinator", []string{"--role", "coordinator"}, func(o *memdd.Options) {
			o.ServerRole, o.ID, o.Capacity, o.TCPListen, o.ShmSocket, o.ShmOptional = false, "", 0, "", "", false
		}},
		{"server", []string{"--role", "server", "--coordinator", "http://c:7470", "--token", " t ", "--id", "s1",
			"--advertise-url", "http://s1:7470", "--tcp-advertise", "10.0.0.1:7471", "--failure-domain", "rack1", "--mlock=false"},
			func(o *memdd.Options) {
				o.CoordRole, o.CoordinatorURL, o.Token, o.NewTokenFile, o.ID = false, "http://c:7470", "t", "", "s1"
				o.AdvertiseURL, o.TCPAdvertise, o.Domain, o.Mlock = "http://s1:7470", "10.0.0.1:7471", "rack1", false
			}},
		{"token file", []string{"--runtime-dir", withToken}, func(o *memdd.Options) {
			o.Token, o.NewTokenFile, o.ShmSocket = "from-the-file", "", filepath.Join(withToken, "memd-data.sock")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--config", config, "--runtime-dir", run, "--data-dir", data, "--capacity", "4MiB"}, tt.args...)
			got, err := serveOptions(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			want := base
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("options\n got %+v\nwant %+v", got, want)
			}
		})
	}
}
