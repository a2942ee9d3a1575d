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
