package swaprun

import (
	"context"
	"errors"
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
