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
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"rmem/internal/agentd"
	"rmem/internal/cli"
	"rmem/pager"
)

// memagent top: the agent's programs live, refreshed every interval, the
// way top and iostat 1 show CPU and disks. What a frame shows is a plain
// function of two stats snapshots and the time between them (topRows,
// writeTop); the loop only fetches, draws and reads keys.

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
			interval, err := app.Duration("interval")
			if err != nil {
				return err
			}
			if interval < 100*time.Millisecond {
				return app.Invalid("interval", "must be at least 100ms")
			}
			once, err := app.Bool("once")
			if err != nil {
				return err
			}
			key := byte('m')
			if s := app.String("sort"); s != "" {
				if !strings.ContainsRune(topKeys, rune(s[0])) || len(s) != 1 {
					return app.Invalid("sort", "want one of %s", strings.Split(topKeys, ""))
				}
				key = s[0]
			}
			return runTop(cmd.Context(), app.String("admin-socket"), interval, once, key, os.Stdin, os.Stdout)
		},
	}
	f := cmd.Flags()
	f.String("admin-socket", agentd.DefaultAdminSocket, "admin socket of the agent")
	f.String("interval", "1s", "time between frames")
	f.Bool("once", false, "print one frame, with rates over one interval, and exit")
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

// writeTop draws one frame of rows (sorted already) for a terminal of
// width x height (0: no limit): a line about the agent, one about its
// pool, the keys, and the table. comm names a pid's program ("" unknown).
func writeTop(w io.Writer, prev, cur agentd.StatsResponse, rows []topRow, dt time.Duration, now time.Time, key byte,
	width, height int, comm func(pid int) string, eol string) error {
	var lines []string
	cpu := "-"
	if dt > 0 {
		cpu = fmt.Sprintf("%.0f%% (polling %.0f%%)", 100*float64(cur.Process.CPU-prev.Process.CPU)/float64(dt),
			100*float64(cur.Process.Polled()-prev.Process.Polled())/float64(dt))
	}
	lines = append(lines, fmt.Sprintf("memagent top - %s  programs %d  agent CPU %s", now.Format(time.TimeOnly), len(rows), cpu))
	p := cur.Pool
	pool := fmt.Sprintf("pool: %s held in %d slabs, %s used by pages, replicas %d", compactBytes(p.HeldBytes), p.Slabs, compactBytes(p.UsedBytes), cur.Replicas)
	if p.NoRoom != "" {
		pool += "; NO ROOM: " + p.NoRoom
	}
	lines = append(lines, pool)
	sorts := map[byte]string{'m': "misses/s", 'r': "resident", 's': "stall", 'e': "evictions/s", 'p': "pid"}
	lines = append(lines, fmt.Sprintf("sorted by %s; keys: m r s e p sort, q quits", sorts[key]), "")
	header := topHeader
	wide := width == 0 || width > len(topHeader)+7
	if wide {
		header += " COMMAND"
	}
	lines = append(lines, header)
	for _, r := range rows {
		s := r.s
		misses, evicts, wbs, stall := "-", "-", "-", "-"
		if r.rated {
			misses, evicts, wbs = compactRate(r.misses), compactRate(r.evicts), compactRate(r.wbs)
			stall = fmt.Sprintf("%.1f%%", 100*r.stall)
		}
		hit := "-"
		if s.PrefetchHits+s.PrefetchWasted > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*s.PrefetchHitRate())
		}
		line := fmt.Sprintf("%7d %5s %5s %5s %6s %5s %5s %5s %6s %6s %4s %4s %4s", s.PID,
			compactBytes(s.ResidentBytes), compactBytes(s.RemoteBytes), compactBytes(s.BudgetBytes), misses,
			compactDur(s.FaultP50), compactDur(s.FaultP99), stall, evicts, wbs, hit, compactCount(s.BudgetWaits), compactCount(s.Lost))
		if wide && comm != nil {
			line += " " + comm(s.PID)
		}
		lines = append(lines, line)
	}
	if height > 0 && len(lines) > height {
		lines = lines[:height]
	}
	for i, l := range lines {
		if r := []rune(l); width > 0 && len(r) > width {
			l = string(r[:width])
		}
		if i < len(lines)-1 || eol == "\n" {
			l += eol
		}
		if _, err := io.WriteString(w, l); err != nil {
			return err
		}
	}
	return nil
}

// compactBytes is n in at most 5 columns: 512B, 64K, 12.5M, 1.2G.
func compactBytes(n uint64) string {
	v, unit := float64(n), ""
	for _, u := range []string{"K", "M", "G", "T"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	switch {
	case unit == "":
		return strconv.FormatUint(n, 10) + "B"
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64) + unit
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + unit
}

// compactRate is a rate per second in at most 6 columns: 12, 1.2k, 123.4k, 1.2M.
func compactRate(r float64) string {
	switch {
	case r < 1000:
		return strconv.FormatFloat(r, 'f', 0, 64)
	case r < 1e6:
		return strconv.FormatFloat(r/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(r/1e6, 'f', 1, 64) + "M"
}

// compactCount is a count in at most 4 columns: 12, 999, 1.2k, 12k, 1.2M.
func compactCount(n uint64) string {
	switch {
	case n < 1000:
		return strconv.FormatUint(n, 10)
	case n < 10000:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + "k"
	case n < 1e6:
		return strconv.FormatUint(n/1000, 10) + "k"
	case n < 1e7:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	}
	return strconv.FormatUint(n/1e6, 10) + "M"
}

// compactDur is d in at most 5 columns: 850n, 12µs, 1.2ms, 12ms, 1.2s.
func compactDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "n"
	case d < 10*time.Microsecond:
		return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) + "µs"
	case d < time.Millisecond:
		return strconv.FormatInt(int64(d/time.Microsecond), 10) + "µs"
	case d < 10*time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms"
	case d < time.Second:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
}

// procComm is the command name of pid on this node ("" when it is gone).
func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// runTop fetches the agent's stats every interval and draws them on out;
// keys come from in when it is a terminal (put in raw mode meanwhile).
func runTop(ctx context.Context, admin string, interval time.Duration, once bool, key byte, in, out *os.File) error {
	fetch := func() (agentd.StatsResponse, time.Time, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		st, err := agentd.FetchStats(cctx, admin)
		return st, time.Now(), err
	}
	prev, at, err := fetch()
	if err != nil {
		return err
	}
	if once {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
		cur, now, err := fetch()
		if err != nil {
			return err
		}
		rows := topRows(prev, cur, now.Sub(at))
		sortTop(rows, key)
		return writeTop(out, prev, cur, rows, now.Sub(at), now, key, 0, 0, procComm, "\n")
	}
	width, height := 80, 24
	interactive := term.IsTerminal(int(out.Fd()))
	if interactive {
		if w, h, err := term.GetSize(int(out.Fd())); err == nil {
			width, height = w, h
		}
		fmt.Fprint(out, "\x1b[?1049h\x1b[?25l") // the alternate screen, no cursor
		defer fmt.Fprint(out, "\x1b[?25h\x1b[?1049l")
	}
	keys := -1
	if term.IsTerminal(int(in.Fd())) {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(in.Fd()), old)
		keys = int(in.Fd())
	}
	cur, now := prev, at
	draw := func() error {
		rows := topRows(prev, cur, now.Sub(at))
		sortTop(rows, key)
		if interactive {
			if w, h, err := term.GetSize(int(out.Fd())); err == nil {
				width, height = w, h
			}
			fmt.Fprint(out, "\x1b[H\x1b[2J")
		}
		return writeTop(out, prev, cur, rows, now.Sub(at), now, key, width, height, procComm, "\r\n")
	}
	if err := draw(); err != nil {
		return err
	}
	next := time.Now().Add(interval)
	for {
		k, err := waitKey(ctx, keys, time.Until(next))
		if err != nil {
			return err
		}
		switch {
		case k == 'q' || k == 'Q' || k == 3 || k == 4: // q, ^C, ^D
			return nil
		case k != 0 && strings.IndexByte(topKeys, k) >= 0:
			key = k
			if err := draw(); err != nil {
				return err
			}
			continue
		case k != 0 || time.Now().Before(next):
			continue
		}
		st, t, err := fetch()
		if err != nil {
			return err
		}
		prev, at, cur, now = cur, now, st, t
		next = t.Add(interval)
		if err := draw(); err != nil {
			return err
		}
	}
}

// waitKey waits up to d for a key on fd (-1: none, only the wait) and
// returns it, or 0 when d passed first.
func waitKey(ctx context.Context, fd int, d time.Duration) (byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, nil
	}
	if fd < 0 {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(d):
			return 0, nil
		}
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds())+1)
	if err == unix.EINTR || n == 0 {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var b [1]byte
	if m, err := unix.Read(fd, b[:]); err != nil || m == 0 {
		return 'q', nil // the terminal went away
	}
	return b[0], nil
}
