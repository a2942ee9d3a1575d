//go:build !verbs

package verbs_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"rmem/rdma"
	"rmem/rdma/verbs"
)

func TestNotBuilt(t *testing.T) {
	_, err := rdma.Dial(context.Background(), "verbs", "127.0.0.1:1", rdma.DialOptions{})
	if !errors.Is(err, verbs.ErrNotBuilt) {
		t.Fatalf("dial: %v, want ErrNotBuilt", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "-tags verbs") {
		t.Fatalf("error is not one line naming the build tag: %q", msg)
	}
	d := rdma.NewDomain(rdma.DomainOptions{})
	if _, err := rdma.Listen("verbs", "127.0.0.1:0", d, rdma.ListenOptions{}); !errors.Is(err, verbs.ErrNotBuilt) {
		t.Fatalf("listen: %v, want ErrNotBuilt", err)
	}
}
