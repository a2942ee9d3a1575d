package pager

import "testing"

func TestPageBits(t *testing.T) {
	p := Page(0).With(Remote) | FlagDirty | FlagRef
	if p.State() != Remote || !p.Has(FlagDirty|FlagRef) || p.Has(FlagBusy) {
		t.Fatalf("%08b", p)
	}
	p = p.With(Resident)
	if p.State() != Resident || !p.Has(FlagDirty) {
		t.Fatalf("With lost flags: %08b", p)
	}
	for s := Absent; s <= Lost; s++ {
		if Page(0xff).With(s).State() != s {
			t.Fatalf("state %v does not round-trip", s)
		}
	}
}

func TestWatermarks(t *testing.T) {
	for _, tc := range []struct {
		budget    int
		high, low int
	}{
		{1000, 950, 900},
		{100, 95, 90},
		{10, 9, 8},
		{2, 1, 0},
		{0, 1, 0},
		{20, 19, 18},
		{5120, 4864, 4736},    // 20 MiB: 95% is two batches under
		{24576, 24320, 24192}, // 96 MiB: two batches under, then one
	} {
		w := WatermarksFor(tc.budget)
		if w.High != tc.high || w.Low != tc.low {
			t.Errorf("budget %d: got %+v, want high %d low %d", tc.budget, w, tc.high, tc.low)
		}
	}
	w := WatermarksFor(100)
	for _, tc := range []struct{ resident, inFlight, want int }{
		{95, 0, 0}, {96, 0, 6}, {120, 0, 30}, {120, 30, 0}, {120, 10, 20},
	} {
		if got := w.ToEvict(tc.resident, tc.inFlight); got != tc.want {
			t.Errorf("ToEvict(%d, %d) = %d, want %d", tc.resident, tc.inFlight, got, tc.want)
		}
	}
}

func table(s string) PageTable {
	t := make(PageTable, len(s))
	for i, c := range s {
		switch c {
		case 'r':
			t[i] = Page(0).With(Resident)
		case 'R':
			t[i] = Page(0).With(Resident) | FlagRef
		case 'b':
			t[i] = Page(0).With(Resident) | FlagBusy
		case 'H':
			t[i] = Page(0).With(Resident) | FlagHot
		case 'x':
			t[i] = Page(0).With(Remote)
		case 'g':
			t[i] = Page(0).With(Remote) | FlagGhost
		case '.':
			t[i] = Page(0).With(Absent)
		}
	}
	return t
}

func TestClock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tables []string
		want   int
		first  Victim
		hand   Clock
	}{
		{"unreferenced first", []string{"rrrr"}, 2, Victim{0, 0}, Clock{}},
		{"second chance", []string{"RRrR"}, 2, Victim{0, 2}, Clock{}},
		{"all referenced: second pass", []string{"RRRR"}, 2, Victim{0, 0}, Clock{}},
		{"skips busy, remote, absent", []string{"bx.r"}, 1, Victim{0, 3}, Clock{}},
		{"nothing evictable ends", []string{"bx.."}, 0, Victim{}, Clock{}},
		{"across tables from the hand", []string{"rr", "xr"}, 2, Victim{1, 1}, Clock{Table: 1}},
		{"empty tables", []string{"", ""}, 0, Victim{}, Clock{}},
		{"hot passed over", []string{"HrHr"}, 2, Victim{0, 1}, Clock{}},
		{"only hot: second turn", []string{"HHH"}, 2, Victim{0, 0}, Clock{}},
		{"hot over its share made cold", []string{"HHHr"}, 2, Victim{0, 3}, Clock{overHot: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tabs []PageTable
			for _, s := range tc.tables {
				tabs = append(tabs, table(s))
			}
			out := make([]Victim, 2)
			c := tc.hand
			n := c.Victims(tabs, out)
			if n != tc.want {
				t.Fatalf("got %d victims %v, want %d", n, out[:n], tc.want)
			}
			if n > 0 && out[0] != tc.first {
				t.Fatalf("first victim %v, want %v", out[0], tc.first)
			}
			seen := map[Victim]bool{}
			for _, v := range out[:n] {
				if seen[v] {
					t.Fatalf("victim %v twice", v)
				}
				seen[v] = true
				if pg := tabs[v.Table][v.Page]; pg.State() != Resident || !pg.Has(FlagBusy) {
					t.Fatalf("victim %v: %08b, want resident and busy", v, pg)
				}
			}
		})
	}
	// The hand moves on: the next call does not return the same pages.
	tabs := []PageTable{table("rrrrrr")}
	var c Clock
	out := make([]Victim, 3)
	c.Victims(tabs, out)
	a := out[0]
	c.Victims(tabs, out)
	if out[0] == a {
		t.Fatalf("hand did not advance: %v twice", a)
	}
}

func TestClockNoAllocs(t *testing.T) {
	tabs := []PageTable{table("RrRrRrRr"), table("rrrr")}
	out := make([]Victim, 4)
	var c Clock
	if n := testing.AllocsPerRun(100, func() {
		for i := range tabs {
			for j := range tabs[i] {
				tabs[i][j] &^= FlagBusy
			}
		}
		c.Victims(tabs, out)
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

// The page's way through hot and cold: evicted it is a ghost, a fault
// before the hand passes makes it hot, the hand clears a ghost it passes
// (a fault after that brings the page back cold), and hot pages over their
// share in a turn are made cold in the next.
func TestClockHotCold(t *testing.T) {
	p := (Page(0).With(Resident) | FlagDirty | FlagRef | FlagHot).Evicted(Remote)
	if p != Page(0).With(Remote)|FlagGhost {
		t.Fatalf("evicted: %016b", p)
	}
	if q := p.FaultedIn(); q != Page(0).With(Resident)|FlagRef|FlagHot {
		t.Fatalf("ghost faulted in: %016b, want resident, referenced, hot", q)
	}
	if q := Page(0).With(Remote).FaultedIn(); q != Page(0).With(Resident)|FlagRef {
		t.Fatalf("faulted in: %016b, want resident, referenced, cold", q)
	}

	tabs := []PageTable{table("gr")}
	var c Clock
	out := make([]Victim, 1)
	if n := c.Victims(tabs, out); n != 1 || out[0] != (Victim{0, 1}) {
		t.Fatalf("victims %v", out[:n])
	}
	if tabs[0][0].Has(FlagGhost) {
		t.Fatalf("the hand passed a ghost and left it: %016b", tabs[0][0])
	}

	// Hot pages at their share (32 of 33) stay hot; over it (33 of 34),
	// the next turn makes them cold as it passes them.
	for _, tc := range []struct {
		hot  int
		cold bool
	}{{32, false}, {33, true}} {
		tabs = []PageTable{make(PageTable, tc.hot+1)}
		for i := range tc.hot {
			tabs[0][i] = Page(0).With(Resident) | FlagHot
		}
		tabs[0][tc.hot] = Page(0).With(Resident)
		c = Clock{}
		for turn := range 2 {
			if n := c.Victims(tabs, out); n != 1 || out[0] != (Victim{0, tc.hot}) {
				t.Fatalf("%d hot, turn %d: victims %v", tc.hot, turn, out[:n])
			}
			tabs[0][tc.hot] = Page(0).With(Resident) // another cold page there
		}
		if got := !tabs[0][0].Has(FlagHot) && !tabs[0][tc.hot-1].Has(FlagHot); got != tc.cold {
			t.Errorf("%d hot pages of %d: made cold %v, want %v", tc.hot, tc.hot+1, got, tc.cold)
		}
	}
}

// A table Skip names is passed over whole: its pages are not taken, nor
// their reference bits cleared; and a hand whose every table is skipped
// takes nothing, and ends.
func TestClockSkip(t *testing.T) {
	tabs := []PageTable{table("rrrR"), table("rr")}
	c := Clock{Skip: func(i int) bool { return i == 0 }}
	out := make([]Victim, 4)
	if n := c.Victims(tabs, out); n != 2 || out[0] != (Victim{1, 0}) || out[1] != (Victim{1, 1}) {
		t.Fatalf("victims %v, want table 1's two pages", out[:n])
	}
	if !tabs[0][3].Has(FlagRef) || tabs[0][0].Has(FlagBusy) {
		t.Fatalf("the skipped table was looked at: %v", tabs[0])
	}
	c.Skip = func(int) bool { return true }
	if n := c.Victims(tabs, out); n != 0 {
		t.Fatalf("every table skipped: %d victims", n)
	}
}
