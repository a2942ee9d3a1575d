package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
	"rmem/pool"
	"rmem/pool/client"
)

// addClientFlags declares the flags of the admin commands.
func addClientFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("coordinator", "", "coordinator URL (env MEMD_COORDINATOR; default "+client.DefaultURL+")")
	f.Bool("json", false, "print JSON for scripts instead of a table")
	f.String("timeout", "10s", "timeout of each request")
	addCommonFlags(f)
}

// adminClient builds the API client from the admin flags.
func adminClient(app *cli.App) (*client.Client, error) {
	url := app.String("coordinator")
	if url == "" {
		url = client.DefaultURL
	}
	timeout, err := positive(app, "timeout")
	if err != nil {
		return nil, err
	}
	_, tlsCfg, err := readTLS(app, false)
	if err != nil {
		return nil, err
	}
	tok := strings.TrimSpace(app.String("token"))
	if tok == "" {
		file := app.String("token-file")
		if file == "" {
			file = filepath.Join(app.String("runtime-dir"), tokenFileName)
		}
		t, err := client.LoadToken(file)
		if err != nil && (tlsCfg == nil || tlsCfg.Certificates == nil) {
			hint := ""
			if errors.Is(err, os.ErrPermission) {
				hint = " (run as root, or pass the token)"
			}
			return nil, fmt.Errorf("no control API token: pass --token or MEMD_TOKEN, or --token-file: %w%s", err, hint)
		}
		tok = t
	}
	c, err := client.New(url, client.Options{Token: tok, TLS: tlsCfg, Timeout: timeout})
	if err != nil {
		return nil, app.Invalid("coordinator", "%v", err)
	}
	return c, nil
}

// adminCmd makes a command whose run gets a client and the --json flag.
func adminCmd(app *cli.App, use, short string, args cobra.PositionalArgs, run func(ctx context.Context, c *client.Client, asJSON bool, args []string) error) *cobra.Command {
	cmd := &cobra.Command{
		Use: use, Short: short, Args: args,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := app.Bool("json")
			if err != nil {
				return err
			}
			c, err := adminClient(app)
			if err != nil {
				return err
			}
			defer c.CloseIdleConnections()
			return run(cmd.Context(), c, asJSON, args)
		},
	}
	addClientFlags(cmd)
	return cmd
}

func age(d pool.Duration) string { return d.Std().Round(time.Millisecond).String() }

func newStatusCmd(app *cli.App) *cobra.Command {
	return adminCmd(app, "status", "Show the pool: capacity, use, servers, agents, replication health", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, asJSON bool, _ []string) error {
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			// Any coordinator answers this; an older memd has no such route.
			if cv, err := c.Coordinators(ctx); err == nil {
				st.Coordinators = &cv
			} else if !errors.Is(err, pool.ErrNotFound) {
				return err
			}
			if asJSON {
				return cli.PrintJSON(app.Stdout(), st)
			}
			t := cli.NewTable(app.Stdout(), "POOL", "")
			pct := 0.0
			if st.Capacity > 0 {
				pct = 100 * float64(st.Used) / float64(st.Capacity)
			}
			t.Row("capacity", cli.Size(st.Capacity))
			t.Row("used", fmt.Sprintf("%s (%.1f%%)", cli.Size(st.Used), pct))
			t.Row("free", cli.Size(st.Free))
			t.Row("slab size", cli.Size(st.SlabSize))
			if st.ServersUnknown > 0 {
				t.Row("servers", fmt.Sprintf("%d up, %d unknown (not heard from since the coordinator started), %d down, %d draining", st.ServersUp, st.ServersUnknown, st.ServersDown, st.ServersDrain))
			} else {
				t.Row("servers", fmt.Sprintf("%d up, %d down, %d draining", st.ServersUp, st.ServersDown, st.ServersDrain))
			}
			if st.AgentsNoRoom > 0 {
				t.Row("agents", fmt.Sprintf("%d, %d waiting for room (their programs are at their budgets)", st.Agents, st.AgentsNoRoom))
			} else {
				t.Row("agents", st.Agents)
			}
			if st.SlabsUnknown > 0 {
				t.Row("slabs", fmt.Sprintf("%d: %d healthy, %d degraded, %d lost, %d unknown (on servers not heard from yet)", st.Slabs, st.SlabsHealthy, st.SlabsDegraded, st.SlabsLost, st.SlabsUnknown))
			} else {
				t.Row("slabs", fmt.Sprintf("%d: %d healthy, %d degraded, %d lost", st.Slabs, st.SlabsHealthy, st.SlabsDegraded, st.SlabsLost))
			}
			if cv := st.Coordinators; cv != nil {
				store := cv.Store
				if len(cv.Endpoints) > 0 {
					store += " " + strings.Join(cv.Endpoints, ",")
				}
				t.Row("store", store)
				for i, m := range cv.Coordinators {
					what := "follower"
					if m.Leader {
						what = "leader"
						if m.Epoch != 0 {
							what = fmt.Sprintf("leader, epoch %d", m.Epoch)
						}
					}
					key := ""
					if i == 0 {
						key = "coordinators"
					}
					t.Row(key, fmt.Sprintf("%s %s (%s)", m.ID, m.URL, what))
				}
				if cv.Leader == nil {
					t.Row("leader", "none: an election is under way")
				}
				if cv.Error != "" {
					t.Row("warning", cv.Error)
				}
			}
			return t.Flush()
		})
}

func newServersCmd(app *cli.App) *cobra.Command {
	return adminCmd(app, "servers", "List the memory servers", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, asJSON bool, _ []string) error {
			ss, err := c.Servers(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(app.Stdout(), ss)
			}
			t := cli.NewTable(app.Stdout(), "SERVER", "STATE", "DRAINING", "CAPACITY", "USED", "FREE", "SLABS", "HEARTBEAT", "DOMAIN", "DATA PLANE")
			for _, s := range ss {
				hb := age(s.HeartbeatAge) + " ago"
				if s.LastHeartbeat.IsZero() {
					hb = "none since the coordinator started"
				}
				addrs := make([]string, 0, len(s.Addrs))
				for p, a := range s.Addrs {
					addrs = append(addrs, p+"="+a)
				}
				sort.Strings(addrs)
				t.Row(s.ID, s.State, s.Draining, cli.Size(s.Capacity), cli.Size(s.Used), cli.Size(s.Capacity-s.Used),
					fmt.Sprintf("%d/%d", s.UsedSlabs, s.Slabs), hb, dash(s.Domain), strings.Join(addrs, " "))
			}
			return t.Flush()
		})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newAgentsCmd(app *cli.App) *cobra.Command {
	return adminCmd(app, "agents", "List the agents' leases, slabs, bytes held and used", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, asJSON bool, _ []string) error {
			ls, err := c.Leases(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(app.Stdout(), ls)
			}
			t := cli.NewTable(app.Stdout(), "AGENT", "NODE", "PID", "LEASE", "SLABS", "REPLICAS", "HELD", "USED", "STEERED", "TTL", "EXPIRES IN")
			for _, l := range ls {
				var used any = cli.Size(l.Used)
				if l.NoRoom {
					used = fmt.Sprintf("%v (no room)", cli.Size(l.Used))
				}
				// Programs whose budget a slowdown target steers: how
				// many, their budgets, their bytes in the pool, their
				// highest stall.
				steered := "-"
				if l.Steered > 0 {
					steered = fmt.Sprintf("%d: budget %v, remote %v, stall <= %.2f%%", l.Steered, cli.Size(l.SteeredBudget), cli.Size(l.SteeredRemote), l.MaxStallPct)
				}
				t.Row(l.Agent, dash(l.Node), l.PID, l.ID, l.Slabs, l.Replicas, cli.Size(l.Bytes), used, steered, l.TTL.Std(), time.Until(l.Expires).Round(time.Millisecond))
			}
			return t.Flush()
		})
}

func newSlabsCmd(app *cli.App) *cobra.Command {
	cmd := adminCmd(app, "slabs", "List slabs and where their replicas are", cobra.NoArgs,
		func(ctx context.Context, c *client.Client, asJSON bool, _ []string) error {
			ss, err := c.Slabs(ctx, client.SlabFilter{Server: pool.ServerID(app.String("server")), Agent: app.String("agent")})
			if err != nil {
				return err
			}
			if asJSON {
				return cli.PrintJSON(app.Stdout(), ss)
			}
			t := cli.NewTable(app.Stdout(), "SLAB", "AGENT", "LEASE", "SIZE", "LAYOUT", "REPLICAS (server/index state; shard#)")
			for _, s := range ss {
				reps := make([]string, len(s.Replicas))
				for i, r := range s.Replicas {
					reps[i] = fmt.Sprintf("%s/%d %s", r.Server, r.Index, r.State)
					if s.Layout != "" && !strings.HasPrefix(s.Layout, "stripe:") {
						reps[i] += fmt.Sprintf(" #%d", r.Shard)
					}
				}
				layout := "copies"
				switch {
				case strings.HasPrefix(s.Layout, "stripe:"):
					layout = fmt.Sprintf("%s part %d of %d", s.Layout, s.Part, s.Group)
				case s.Layout != "":
					layout = s.Layout
				}
				t.Row(s.ID, s.Agent, s.Lease, cli.Size(s.Size), layout, strings.Join(reps, ", "))
			}
			return t.Flush()
		})
	cmd.Flags().String("server", "", "only slabs with a replica on this server")
	cmd.Flags().String("agent", "", "only slabs of this agent")
	return cmd
}

func newDrainCmd(app *cli.App, on bool) *cobra.Command {
	use, short := "drain SERVER", "Stop placing on SERVER and move its slabs away; show progress until it is empty"
	if !on {
		use, short = "undrain SERVER", "Let SERVER take new slabs again"
	}
	cmd := adminCmd(app, use, short, cobra.ExactArgs(1),
		func(ctx context.Context, c *client.Client, asJSON bool, args []string) error {
			id := pool.ServerID(args[0])
			v, err := c.Drain(ctx, id, on)
			if err != nil {
				return err
			}
			wait := false
			if on {
				noWait, err := app.Bool("no-wait")
				if err != nil {
					return err
				}
				wait = !noWait
			}
			out := app.Stdout()
			var stall time.Duration
			if wait {
				if stall, err = positive(app, "stall-timeout"); err != nil {
					return err
				}
			}
			left, progress := v.Replicas, time.Now()
			blockedPolls := 0
			for wait && !v.Done {
				if !asJSON {
					if v.Blocked > 0 {
						fmt.Fprintf(out, "draining %s: %d replicas left, %d with nowhere to go (%s)\n", id, v.Replicas, v.Blocked, v.Reason)
					} else {
						fmt.Fprintf(out, "draining %s: %d replicas left\n", id, v.Replicas)
					}
				}
				// Every replica left blocked for three looks in a row (an
				// agent's copy in flight can look blocked for a moment): no
				// progress is possible until the pool changes.
				if v.Blocked >= v.Replicas {
					blockedPolls++
				} else {
					blockedPolls = 0
				}
				var stuck error
				switch {
				case blockedPolls >= 3:
					stuck = fmt.Errorf("drain of %s cannot finish: %s; %s stays draining (add a server with free slabs, or memd undrain %s)", id, v.Reason, id, id)
				case time.Since(progress) > stall:
					stuck = fmt.Errorf("drain of %s made no progress in %v: %d replicas left; %s stays draining (are the agents holding them running? memd slabs --server %s)", id, stall, v.Replicas, id, id)
				}
				if stuck != nil {
					if asJSON {
						if err := cli.PrintJSON(out, v); err != nil {
							return err
						}
					}
					return stuck
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Second):
				}
				if v, err = c.DrainStatus(ctx, id); err != nil {
					return err
				}
				if !v.Draining {
					return fmt.Errorf("drain of %s was cancelled (undrain)", id)
				}
				if v.Replicas < left {
					left, progress = v.Replicas, time.Now()
				}
			}
			if asJSON {
				return cli.PrintJSON(out, v)
			}
			switch {
			case !on:
				fmt.Fprintf(out, "%s takes new slabs again\n", id)
			case v.Done:
				fmt.Fprintf(out, "%s is drained: no replicas left\n", id)
			default:
				fmt.Fprintf(out, "draining %s: %d replicas left (memd drain %s to follow)\n", id, v.Replicas, id)
			}
			return nil
		})
	if on {
		cmd.Flags().Bool("no-wait", false, "start the drain and return without waiting for it to finish")
		cmd.Flags().String("stall-timeout", "2m", "give up waiting (exit 1, the drain stays on) when no replica has moved for this long")
	}
	return cmd
}
