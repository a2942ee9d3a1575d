package main

import (
	"bytes"
	"strings"
	"testing"
)

// Every command builds (a flag declared twice on one command panics at
// start) and says --redundancy where pages reach the pool.
func TestCommands(t *testing.T) {
	root := newRoot()
	for _, name := range []string{"run", "serve", "mount"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd.SetOut(&out)
		if err := cmd.Help(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "--redundancy") {
			t.Errorf("memagent %s --help lacks --redundancy:\n%s", name, out.String())
		}
	}
}
