package agentd

import (
	"runtime"
	"testing"
)

// Each running loop adds a P; when they have all stopped, GOMAXPROCS is
// what it was.
func TestLoopProcs(t *testing.T) {
	n0 := runtime.GOMAXPROCS(0)
	var lp loopProcs
	lp.changed(1)
	lp.changed(2)
	if n := runtime.GOMAXPROCS(0); n != n0+2 {
		t.Errorf("two loops: GOMAXPROCS %d, want %d", n, n0+2)
	}
	lp.changed(1)
	if n := runtime.GOMAXPROCS(0); n != n0+1 {
		t.Errorf("one loop: GOMAXPROCS %d, want %d", n, n0+1)
	}
	lp.changed(0)
	if n := runtime.GOMAXPROCS(0); n != n0 {
		t.Errorf("no loop: GOMAXPROCS %d, want %d as before", n, n0)
	}
}
