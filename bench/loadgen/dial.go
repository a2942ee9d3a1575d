package loadgen

import (
	"context"
	"fmt"
	"net"
	"strings"
)

// Dialer returns a Config.Dial for addr: a Unix socket ("unix:PATH", or a
// path starting with / or .) or a TCP address ("HOST:PORT").
func Dialer(addr string) func(ctx context.Context) (net.Conn, error) {
	network := "tcp"
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", p
	} else if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, ".") {
		network = "unix"
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// Distributions are the names NewKeys takes.
var Distributions = []string{"uniform", "zipf"}

// NewKeys returns the key distribution named dist over n keys: "uniform",
// or "zipf" (theta, its popular keys scattered by a permutation seeded
// with seed).
func NewKeys(dist string, n int, theta float64, seed uint64) (Keys, error) {
	switch dist {
	case "uniform":
		return Uniform{N: uint64(n)}, nil
	case "zipf":
		z, err := NewZipf(uint64(n), theta)
		if err != nil {
			return nil, err
		}
		return NewScrambled(z, uint64(n), seed), nil
	}
	return nil, fmt.Errorf("loadgen: unknown key distribution %q (want uniform or zipf)", dist)
}
