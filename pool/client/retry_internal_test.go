package client

import (
	"testing"
	"time"
)

// TestRetryWait: a round ends in a back-off cut short at the deadline, and
// the client gives up only once the deadline has passed, however long the
// next back-off would be (it once gave up at 212 ms of a 500 ms RetryFor
// because the next wait would have overrun it).
func TestRetryWait(t *testing.T) {
	t0 := time.Unix(1000, 0)
	deadline := t0.Add(500 * time.Millisecond)
	for _, tc := range []struct {
		name            string
		now             time.Duration // since t0
		backoff, jitter time.Duration
		wait            time.Duration
		giveUp          bool
	}{
		{"early", 0, 50 * time.Millisecond, 10 * time.Millisecond, 60 * time.Millisecond, false},
		{"cut at the deadline", 212 * time.Millisecond, 400 * time.Millisecond, 100 * time.Millisecond, 288 * time.Millisecond, false},
		{"at the deadline", 500 * time.Millisecond, 50 * time.Millisecond, 0, 0, true},
		{"past it", 700 * time.Millisecond, 50 * time.Millisecond, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait, giveUp := retryWait(t0.Add(tc.now), deadline, tc.backoff, tc.jitter)
			if wait != tc.wait || giveUp != tc.giveUp {
				t.Fatalf("retryWait = %v, %v; want %v, %v", wait, giveUp, tc.wait, tc.giveUp)
			}
		})
	}
}
