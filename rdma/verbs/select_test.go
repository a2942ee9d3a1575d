package verbs

import (
	"errors"
	"net"
	"testing"
)

func mapped(ip string) [16]byte { return [16]byte(net.ParseIP(ip).To16()) }

func TestChoose(t *testing.T) {
	linkLocal := [16]byte{0: 0xfe, 1: 0x80, 15: 1}
	devs := []devInfo{
		{Name: "mlx5_0", Port: 1, State: portActive, GIDs: [][16]byte{{0xfe, 0x80, 15: 9}}},
		{Name: "rxe0", Port: 1, Ethernet: true, State: portActive, GIDs: [][16]byte{linkLocal, mapped("10.0.2.15")}},
		{Name: "rxe1", Port: 1, Ethernet: true, State: portActive, GIDs: [][16]byte{linkLocal, mapped("192.168.1.2"), {}}},
	}
	for _, tc := range []struct {
		name string
		ip   string
		cfg  Config
		want selection
		err  bool
	}{
		{"by IP", "10.0.2.15", Config{GIDIndex: -1}, selection{"rxe0", 1, 1}, false},
		{"by IP, second device", "192.168.1.2", Config{GIDIndex: -1}, selection{"rxe1", 1, 1}, false},
		{"by IP, wrong device named", "10.0.2.15", Config{Device: "rxe1", GIDIndex: -1}, selection{"rxe1", 1, 1}, false},
		{"explicit index", "10.0.2.15", Config{Device: "rxe1", GIDIndex: 0}, selection{"rxe1", 1, 0}, false},
		{"index out of table", "", Config{Device: "rxe1", GIDIndex: 7}, selection{}, true},
		{"unspecified IP: InfiniBand port", "0.0.0.0", Config{GIDIndex: -1}, selection{"mlx5_0", 1, 0}, false},
		{"unknown device", "10.0.2.15", Config{Device: "nope", GIDIndex: -1}, selection{}, true},
	} {
		got, err := choose(devs, net.ParseIP(tc.ip), tc.cfg)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v (error %v)", tc.name, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrNoDevice) {
			t.Errorf("%s: error %v does not wrap ErrNoDevice", tc.name, err)
		}
	}
	// RoCE only and no GID holds the address: say which address.
	_, err := choose(devs[1:], net.ParseIP("172.16.0.1"), Config{GIDIndex: -1})
	if err == nil || !errors.Is(err, ErrNoDevice) {
		t.Fatalf("address no device serves: %v", err)
	}
	t.Log(err)
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("RMEM_VERBS_DEVICE", "rxe0")
	t.Setenv("RMEM_VERBS_PORT", "1")
	t.Setenv("RMEM_VERBS_GID_INDEX", "1")
	c, err := ConfigFromEnv()
	if err != nil || c != (Config{Device: "rxe0", Port: 1, GIDIndex: 1}) {
		t.Fatalf("%+v, %v", c, err)
	}
	t.Setenv("RMEM_VERBS_GID_INDEX", "x")
	if _, err := ConfigFromEnv(); err == nil {
		t.Fatal("bad RMEM_VERBS_GID_INDEX accepted")
	}
}
