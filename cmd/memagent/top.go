package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"rmem/internal/agentd"
	"rmem/internal/cli"
	"rmem/internal/livetop"
	"rmem/pager"
)

// memagent top: the agent's programs live, refreshed every interval, the
// way top and iostat 1 show CPU and disks. What a frame shows is a plain
// function of two stats snapshots and the time between them (topRows,
// topLines); internal/livetop fetches, draws and reads keys.

func newTopCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show the agent's programs live: memory, misses, stall, evictions",
		Long: `top shows the programs of the agent behind --admin-socket, refreshed every
--interval: resident, remote and budget bytes, misses per second and their
p50/p99, the share of time stalled on misses, evictions and write-backs per
second, the prefetch hit rate, budget waits and lost pages; and the agent's
pool space and CPU.

Keys: m sorts by misses/s, r by resident memory, s by stall, e by
evictions/s, p by pid; q quits. --once prints one frame (rates over one
interval) and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key := byte('m')
			if s := app.String("sort"); s != "" {
				if !strings.ContainsRune(topKeys, rune(s[0])) || len(s) != 1 {
					return app.Invalid("sort", "want one of %s", strings.Split(topKeys, ""))
				}
				key = s[0]
			}
			return livetop.Main(cmd.Context(), app, &agentTop{admin: app.String("admin-socket"), key: key, comm: procComm}, true)
		},
	}
	f := cmd.Flags()
	f.String("admin-socket", agentd.DefaultAdminSocket, "admin socket of the agent")
	livetop.Flags(f)
	f.String("sort", "m", "sort key: m misses/s, r resident, s stall, e evictions/s, p pid")
	return cmd
}

// topKeys are the sort keys.
const topKeys = "mrsep"

// topRow is a program's line: its stats and its rates since the last
// frame (rated false: no last frame for it yet).
type topRow struct {
	s                          pager.ClientStats
	rated                      bool
	misses, evicts, wbs, stall float64 // per second; stall: share of time
}

// topRows pairs cur's programs with prev's by client ID and computes
// their rates over dt.
func topRows(prev, cur agentd.StatsResponse, dt time.Duration) []topRow {
	before := make(map[uint64]pager.ClientStats, len(prev.Clients))
	for _, c := range prev.Clients {
		before[c.ID] = c
	}
	rows := make([]topRow, 0, len(cur.Clients))
	for _, c := range cur.Clients {
		r := topRow{s: c}
		if p, ok := before[c.ID]; ok && dt > 0 {
			sec := dt.Seconds()
			rate := func(a, b uint64) float64 { return float64(b-min(a, b)) / sec }
			r.rated = true
			r.misses = rate(p.Faults, c.Faults)
			r.evicts = rate(p.Evictions, c.Evictions)
			r.wbs = rate(p.WriteBacks, c.WriteBacks)
			r.stall = min(max(float64(c.Stall-p.Stall)/float64(dt), 0), 1)
		}
		rows = append(rows, r)
	}
	return rows
}

// sortTop orders rows by key, largest first (pid: smallest first).
func sortTop(rows []topRow, key byte) {
	slices.SortStableFunc(rows, func(a, b topRow) int {
		var c int
		switch key {
		case 'r':
			c = cmp.Compare(b.s.ResidentBytes, a.s.ResidentBytes)
		case 's':
			c = cmp.Compare(b.stall, a.stall)
		case 'e':
			c = cmp.Compare(b.evicts, a.evicts)
		case 'm':
			c = cmp.Compare(b.misses, a.misses)
		}
		return cmp.Or(c, cmp.Compare(a.s.PID, b.s.PID))
	})
}

// topHeader is the table's header: 79 columns, the room of an 80-column
// terminal; COMMAND follows when the terminal is wider.
const topHeader = "    PID   RES REMOT BUDGT MISS/s   P50   P99 STALL EVIC/s   WB/s  PF% WAIT LOST"

// topLines is one frame of rows (sorted already): a line about the agent,
// one about its pool, the keys, and the table; wide adds COMMAND, which
// comm gives for a pid ("" unknown).
func topLines(prev, cur agentd.StatsResponse, rows []topRow, dt time.Duration, now time.Time, key byte, wide bool, comm func(pid int) string) []string {
	var lines []string
	cpu := "-"
	if dt > 0 {
		cpu = fmt.Sprintf("%.0f%% (polling %.0f%%)", 100*float64(cur.Process.CPU-prev.Process.CPU)/float64(dt),
			100*float64(cur.Process.Polled()-prev.Process.Polled())/float64(dt))
	}
	lines = append(lines, fmt.Sprintf("memagent top - %s  programs %d  agent CPU %s", now.Format(time.TimeOnly), len(rows), cpu))
	p := cur.Pool
	pool := fmt.Sprintf("pool: %s held in %d slabs, %s used by pages, %s", livetop.Bytes(p.HeldBytes), p.Slabs, livetop.Bytes(p.UsedBytes), redundancy(cur.Redundancy, cur.Replicas))
	if p.NoRoom != "" {
		pool += "; NO ROOM: " + p.NoRoom
	}
	lines = append(lines, pool)
	sorts := map[byte]string{'m': "misses/s", 'r': "resident", 's': "stall", 'e': "evictions/s", 'p': "pid"}
	lines = append(lines, fmt.Sprintf("sorted by %s; keys: m r s e p sort, q quits", sorts[key]), "")
	header := topHeader
	if wide {
		header += " COMMAND"
	}
	lines = append(lines, header)
	for _, r := range rows {
		s := r.s
		misses, evicts, wbs, stall := "-", "-", "-", "-"
		if r.rated {
			misses, evicts, wbs = livetop.Rate(r.misses), livetop.Rate(r.evicts), livetop.Rate(r.wbs)
			stall = fmt.Sprintf("%.1f%%", 100*r.stall)
		}
		hit := "-"
		if s.PrefetchHits+s.PrefetchWasted > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*s.PrefetchHitRate())
		}
		line := fmt.Sprintf("%7d %5s %5s %5s %6s %5s %5s %5s %6s %6s %4s %4s %4s", s.PID,
			livetop.Bytes(s.ResidentBytes), livetop.Bytes(s.RemoteBytes), livetop.Bytes(s.BudgetBytes), misses,
			livetop.Dur(s.FaultP50), livetop.Dur(s.FaultP99), stall, evicts, wbs, hit, livetop.Count(s.BudgetWaits), livetop.Count(s.Lost))
		if wide && comm != nil {
			line += " " + comm(s.PID)
		}
		lines = append(lines, line)
	}
	return lines
}

// agentTop is memagent top's screen: the agent's last two stats.
type agentTop struct {
	admin     string
	key       byte
	comm      func(pid int) string
	prev, cur agentd.StatsResponse
	at, now   time.Time // when prev and cur were taken
}

func (a *agentTop) Fetch(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := agentd.FetchStats(cctx, a.admin)
	if err != nil {
		return err
	}
	t := time.Now()
	if a.now.IsZero() { // the first: no rates until the next
		a.cur, a.now = st, t
	}
	a.prev, a.at, a.cur, a.now = a.cur, a.now, st, t
	return nil
}

func (a *agentTop) Draw(w io.Writer, width, height int, eol string) error {
	dt := a.now.Sub(a.at)
	rows := topRows(a.prev, a.cur, dt)
	sortTop(rows, a.key)
	wide := width == 0 || width > len(topHeader)+7
	return livetop.Fit(w, topLines(a.prev, a.cur, rows, dt, a.now, a.key, wide, a.comm), width, height, eol)
}

func (a *agentTop) Key(k byte) bool {
	if strings.IndexByte(topKeys, k) < 0 {
		return false
	}
	a.key = k
	return true
}

// procComm is the command name of pid on this node ("" when it is gone).
func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// redundancy is how an agent's stats say it keeps pages (an agent from
// before redundancy was said: its replicas).
func redundancy(red string, replicas int) string {
	if red == "" {
		return fmt.Sprintf("rep:%d", replicas)
	}
	return red
}
