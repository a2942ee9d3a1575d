package agentd_test

import (
	"testing"

	"go.uber.org/zap"

	"rmem/internal/agentd"
	"rmem/pool"
)

func TestChooseRedundancy(t *testing.T) {
	log := zap.NewNop()
	for _, c := range []struct {
		st   pool.Status
		want string
	}{
		{pool.Status{Redundancy: "ec:6+2", ServersUp: 8, Domains: 8}, "ec:6+2"},
		{pool.Status{Redundancy: "ec:6+2", ServersUp: 8, Domains: 4}, "rep:3"},
		{pool.Status{Redundancy: "ec:6+2", ServersUp: 2, Domains: 2}, "rep:2"},
		{pool.Status{Redundancy: "rep:3", ServersUp: 3, Domains: 3}, "rep:3"},
		{pool.Status{Redundancy: "bad", ServersUp: 3, Domains: 3}, "rep:2"},
	} {
		if got := agentd.ChooseRedundancy(c.st, log).String(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.st, got, c.want)
		}
	}
}

func TestResolveRedundancy(t *testing.T) {
	log := zap.NewNop()
	ec := pool.Redundancy{K: 4, M: 2}
	for _, c := range []struct {
		st       pool.Status
		red      pool.Redundancy
		replicas int
		want     string
	}{
		{pool.Status{ServersUp: 8, Domains: 8}, pool.Redundancy{}, 0, "ec:6+2"},
		{pool.Status{ServersUp: 8, Domains: 7}, pool.Redundancy{}, 0, "rep:2"},
		{pool.Status{ServersUp: 1, Domains: 1}, pool.Redundancy{}, 0, "rep:1"},
		{pool.Status{ServersUp: 8, Domains: 8}, pool.Redundancy{}, 3, "rep:3"},
		{pool.Status{ServersUp: 8, Domains: 8}, ec, 0, "ec:4+2"},
		{pool.Status{ServersUp: 3, Domains: 3}, ec, 0, "ec:4+2"}, // its slabs fall back to copies
		{pool.Status{ServersUp: 8, Domains: 8, Redundancy: "rep:3"}, pool.Redundancy{}, 0, "rep:3"},
	} {
		if got := agentd.ResolveRedundancy(c.st, c.red, c.replicas, log).String(); got != c.want {
			t.Errorf("%+v %v %d: %s, want %s", c.st, c.red, c.replicas, got, c.want)
		}
	}
}
