package cpuidle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSysfs(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, data := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	driver = "devices/system/cpu/cpuidle/current_driver"
	pollNS = "module/haltpoll/parameters/guest_halt_poll_ns"
)

func TestRead(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string
		want    Policy
		slow    bool
		wantErr bool
	}{
		{"no cpuidle", nil, Policy{HaltPollNS: -1}, false, false},
		{"bare metal", map[string]string{driver: "intel_idle\n"}, Policy{"intel_idle", -1}, false, false},
		{"haltpoll, no polling", map[string]string{driver: "haltpoll\n", pollNS: "0\n"}, Policy{"haltpoll", 0}, true, false},
		{"haltpoll, polling", map[string]string{driver: "haltpoll\n", pollNS: "200000\n"}, Policy{"haltpoll", 200000}, false, false},
		{"haltpoll, no parameter", map[string]string{driver: "haltpoll\n"}, Policy{"haltpoll", -1}, false, true},
		{"haltpoll, bad parameter", map[string]string{driver: "haltpoll\n", pollNS: "lots\n"}, Policy{"haltpoll", -1}, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Read(writeSysfs(t, c.files))
			if (err != nil) != c.wantErr {
				t.Fatalf("Read: err %v, want error %v", err, c.wantErr)
			}
			if p != c.want || p.SlowWakeups() != c.slow {
				t.Errorf("Read = %+v (slow %v), want %+v (slow %v)", p, p.SlowWakeups(), c.want, c.slow)
			}
			if advice := p.Advice(); (advice != "") != c.slow || c.slow && !strings.Contains(advice, "guest_halt_poll_ns") {
				t.Errorf("Advice = %q", advice)
			}
		})
	}
}

// This machine's policy, for the record (and Read must not fail on it).
func TestReadHost(t *testing.T) {
	p, err := Read("/sys")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v (slow wake-ups: %v)", p, p.SlowWakeups())
}
