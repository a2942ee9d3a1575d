//go:build race

package pager

// raceEnabled: built with -race, under which the replay's arithmetic runs
// several times slower and finds no race (one goroutine).
const raceEnabled = true
