package tests

import (
	"os"
	"testing"
)

// TestMain runs the suite and then prints the survival table of the
// scenarios that ran (survive_test.go).
func TestMain(m *testing.M) {
	code := m.Run()
	printSurvival()
	os.Exit(code)
}
