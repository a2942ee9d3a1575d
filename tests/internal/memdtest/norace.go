//go:build !race

package memdtest

const raceEnabled = false
