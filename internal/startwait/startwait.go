// Package startwait lets a daemon wait, a bounded time, for what it needs
// from another that may be starting beside it: the pool's coordinator, and
// the token file a local memd writes when it starts. Two units started
// together (memd and memagent under systemd, or `memd serve & memagent run
// -- app`) then come up in either order instead of failing at once.
//
// It is for start-up only: a dependency lost later is the daemon's own
// business (retries, back-pressure, SIGBUS after --fault-timeout). It says
// once what it waits for; it does not decide what is fatal beyond "not
// there yet".
package startwait

import (
	"context"
	"errors"
	"net/http"
	"os"
	"time"

	"rmem/pool/client"
)

// DefaultTimeout is --connect-timeout's default.
const DefaultTimeout = 30 * time.Second

// Delay is the pause before look n (0-based) after the first: 50 ms,
// doubling up to a second, so that a dependency that comes up at once is
// seen at once and one that takes a while costs a look a second.
func Delay(n int) time.Duration {
	d := 50 * time.Millisecond
	for i := 0; i < n && d < time.Second; i++ {
		d *= 2
	}
	return min(d, time.Second)
}

// Until calls look until it reports done, timeout has passed or ctx is
// done, and returns look's last error. say is called once, with look's
// first error, before the first pause: the caller says what it waits for.
// A timeout of zero or less looks once.
func Until(ctx context.Context, timeout time.Duration, look func(context.Context) (done bool, err error), say func(error)) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for n := 0; ; n++ {
		done, err := look(ctx)
		left := time.Until(deadline)
		if done || left <= 0 || ctx.Err() != nil {
			return err
		}
		if n == 0 && say != nil {
			say(err)
		}
		t.Reset(min(Delay(n), left))
		select {
		case <-ctx.Done():
			return err
		case <-t.C:
		}
	}
}

// TokenFile waits for the token file at path to exist and hold a token,
// and returns the token; say is told once that it waits. Another error
// (a file that cannot be read) is returned at once.
func TokenFile(ctx context.Context, path string, timeout time.Duration, say func(error)) (string, error) {
	var tok string
	err := Until(ctx, timeout, func(context.Context) (bool, error) {
		t, err := client.LoadToken(path)
		if err == nil {
			tok = t
			return true, nil
		}
		// Missing, or created but not written yet (memd writes it
		// whole, but a hand-made one may be caught half-way).
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, client.ErrEmptyToken) {
			return false, err
		}
		return true, err
	}, say)
	return tok, err
}

// Retryable reports whether err, from a call to the coordinator, may pass
// as the coordinator comes up: no answer at all (refused, reset, timed
// out), or an answer that it cannot serve yet (503: no leader elected, or
// stopping). An answer that refuses us (a bad token, 401) does not pass
// by waiting.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var ae *client.Error
	if errors.As(err, &ae) {
		return ae.Status == http.StatusServiceUnavailable || ae.Status == http.StatusBadGateway
	}
	return true
}

// Pool waits for the coordinator to answer status; say is told once that
// it waits. It returns status's last error.
func Pool(ctx context.Context, status func(context.Context) error, timeout time.Duration, say func(error)) error {
	return Until(ctx, timeout, func(ctx context.Context) (bool, error) {
		err := status(ctx)
		return err == nil || !Retryable(err), err
	}, say)
}
