package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
	"rmem/internal/livetop"
	"rmem/pool"
	"rmem/pool/client"
)

// memd top: the pool live, its servers and agents, refreshed every
// interval. A frame is a plain function of one snapshot (poolLines).

func newTopCmd(app *cli.App) *cobra.Command {
	cmd := adminCmd(app, "top", "Show the pool live: capacity and use, its servers and agents", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, _ bool, _ []string) error {
			return livetop.Main(ctx, app, &poolTop{c: c, key: 'u'}, false)
		})
	cmd.Long = `top shows the pool behind --coordinator, refreshed every --interval: capacity,
use, servers up and down, slabs' health; each server's state, capacity, use,
slabs and last heartbeat; each agent's node, slabs held and bytes used, and
whether it waits for room.

Keys: u sorts by use, n by name; q quits. --once prints one frame and exits.`
	livetop.Flags(cmd.Flags())
	return cmd
}

// poolTop is memd top's screen: the pool's last snapshot.
type poolTop struct {
	c   *client.Client
	key byte // 'u' use, 'n' name
	snap
}

// snap is one look at the pool.
type snap struct {
	at      time.Time
	st      pool.Status
	servers []pool.ServerView
	leases  []pool.LeaseView
}

func (p *poolTop) Fetch(ctx context.Context) error {
	var s snap
	var err error
	if s.st, err = p.c.Status(ctx); err != nil {
		return err
	}
	if s.servers, err = p.c.Servers(ctx); err != nil {
		return err
	}
	if s.leases, err = p.c.Leases(ctx); err != nil {
		return err
	}
	s.at = time.Now()
	p.snap = s
	return nil
}

func (p *poolTop) Draw(w io.Writer, width, height int, eol string) error {
	return livetop.Fit(w, poolLines(p.snap, p.key), width, height, eol)
}

func (p *poolTop) Key(k byte) bool {
	if k != 'u' && k != 'n' {
		return false
	}
	p.key = k
	return true
}

// poolLines is one frame of s, its servers and agents sorted by key.
func poolLines(s snap, key byte) []string {
	st := s.st
	pct := 0.0
	if st.Capacity > 0 {
		pct = 100 * float64(st.Used) / float64(st.Capacity)
	}
	lines := []string{
		fmt.Sprintf("memd top - %s  capacity %s  used %s (%.1f%%)  free %s", s.at.Format(time.TimeOnly),
			livetop.Bytes(st.Capacity), livetop.Bytes(st.Used), pct, livetop.Bytes(st.Free)),
		fmt.Sprintf("servers %d up, %d down, %d unknown, %d draining; agents %d, %d waiting for room", st.ServersUp, st.ServersDown,
			st.ServersUnknown, st.ServersDrain, st.Agents, st.AgentsNoRoom),
		fmt.Sprintf("slabs %d: %d healthy, %d degraded, %d lost, %d unknown", st.Slabs, st.SlabsHealthy, st.SlabsDegraded, st.SlabsLost, st.SlabsUnknown),
		fmt.Sprintf("sorted by %s; keys: u use, n name; q quits", map[byte]string{'u': "use", 'n': "name"}[key]),
		"",
		fmt.Sprintf("%-16s %-8s %6s %6s %7s %9s %s", "SERVER", "STATE", "CAP", "USED", "SLABS", "HEARTBEAT", "DOMAIN"),
	}
	servers := slices.Clone(s.servers)
	slices.SortFunc(servers, func(a, b pool.ServerView) int {
		if key == 'u' {
			if c := cmp.Compare(b.Used, a.Used); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.ID, b.ID)
	})
	for _, v := range servers {
		state := string(v.State)
		if v.Draining {
			state += ",drain"
		}
		hb := "-"
		if !v.LastHeartbeat.IsZero() {
			hb = livetop.Dur(v.HeartbeatAge.Std())
		}
		lines = append(lines, fmt.Sprintf("%-16.16s %-8.8s %6s %6s %7s %9s %s", v.ID, state, livetop.Bytes(v.Capacity),
			livetop.Bytes(v.Used), fmt.Sprintf("%d/%d", v.UsedSlabs, v.UsedSlabs+v.FreeSlabs), hb, dash(v.Domain)))
	}
	lines = append(lines, "", fmt.Sprintf("%-24s %-12s %7s %5s %6s %6s", "AGENT", "NODE", "PID", "SLABS", "HELD", "USED"))
	leases := slices.Clone(s.leases)
	slices.SortFunc(leases, func(a, b pool.LeaseView) int {
		if key == 'u' {
			if c := cmp.Compare(b.Used, a.Used); c != 0 {
				return c
			}
		}
		return cmp.Or(cmp.Compare(a.Agent, b.Agent), cmp.Compare(a.ID, b.ID))
	})
	for _, l := range leases {
		line := fmt.Sprintf("%-24.24s %-12.12s %7d %5d %6s %6s", l.Agent, dash(l.Node), l.PID, l.Slabs, livetop.Bytes(l.Bytes), livetop.Bytes(l.Used))
		if l.NoRoom {
			line += " NO ROOM"
		}
		if l.Steered > 0 {
			line += fmt.Sprintf(" steered %d, stall <= %.2f%%", l.Steered, l.MaxStallPct)
		}
		lines = append(lines, line)
	}
	return lines
}
