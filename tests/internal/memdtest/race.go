//go:build race

package memdtest

// raceEnabled: the test binary was built with -race, so memd is too.
const raceEnabled = true
