package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// PrintJSON writes v as indented JSON followed by a newline: the --json
// output of the admin commands, stable for scripts and golden tests.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Table writes aligned columns for humans.
type Table struct{ tw *tabwriter.Writer }

// NewTable starts a table with a header row.
func NewTable(w io.Writer, header ...string) *Table {
	t := &Table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	row := make([]any, len(header))
	for i, h := range header {
		row[i] = h
	}
	t.Row(row...)
	return t
}

// Row adds a row; each value is formatted with %v.
func (t *Table) Row(cols ...any) {
	for i, c := range cols {
		if i > 0 {
			fmt.Fprint(t.tw, "\t")
		}
		fmt.Fprint(t.tw, c)
	}
	fmt.Fprint(t.tw, "\n")
}

// Flush writes the table out.
func (t *Table) Flush() error { return t.tw.Flush() }
