package startwait

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rmem/pool/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelay(t *testing.T) {
	want := []time.Duration{50, 100, 200, 400, 800, 1000, 1000, 1000}
	for n, w := range want {
		if got := Delay(n); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", n, got, w*time.Millisecond)
		}
	}
}

func TestTokenFileAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	said := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(300 * time.Millisecond)
		os.WriteFile(path+".tmp", []byte("s3cret\n"), 0o600)
		os.Rename(path+".tmp", path)
	}()
	tok, err := TokenFile(context.Background(), path, time.Minute, func(err error) {
		said++
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("said %v, want the file's absence", err)
		}
	})
	<-done
	if err != nil || tok != "s3cret" {
		t.Fatalf("TokenFile = %q, %v", tok, err)
	}
	if said != 1 {
		t.Fatalf("said %d times that it waits, want once", said)
	}
}

func TestTokenFileTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	_, err := TokenFile(context.Background(), path, 200*time.Millisecond, nil)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file that never came: %v, want the file's absence", err)
	}
	// No wait at all.
	said := false
	_, err = TokenFile(context.Background(), path, 0, func(error) { said = true })
	if !errors.Is(err, os.ErrNotExist) || said {
		t.Fatalf("--connect-timeout 0: %v (said %v)", err, said)
	}
}

func TestTokenFileUnreadableFailsAtOnce(t *testing.T) {
	dir := t.TempDir() // a directory where the file should be
	said := false
	_, err := TokenFile(context.Background(), dir, time.Hour, func(error) { said = true })
	if err == nil || errors.Is(err, os.ErrNotExist) || said {
		t.Fatalf("a token path that is a directory: %v (waited: %v)", err, said)
	}
}

func TestTokenFileStopsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err := TokenFile(ctx, filepath.Join(t.TempDir(), "token"), time.Hour, nil)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestPoolWaitsForTheCoordinator(t *testing.T) {
	refused := &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}
	answers := []error{refused, &client.Error{Status: http.StatusServiceUnavailable, Message: "no leader"}, refused, nil}
	n, said := 0, 0
	err := Pool(context.Background(), func(context.Context) error {
		err := answers[n]
		n++
		return err
	}, time.Minute, func(err error) {
		said++
		if err != refused {
			t.Errorf("said %v, want the first error", err)
		}
	})
	if err != nil || n != len(answers) || said != 1 {
		t.Fatalf("Pool = %v after %d looks, said %d times", err, n, said)
	}
}

func TestPoolDoesNotWaitOutARefusal(t *testing.T) {
	bad := &client.Error{Status: http.StatusUnauthorized, Message: "bad token"}
	n := 0
	err := Pool(context.Background(), func(context.Context) error { n++; return bad }, time.Hour, nil)
	if err != bad || n != 1 {
		t.Fatalf("a 401: %v after %d looks, want it at once", err, n)
	}
}

func TestRetryable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{context.DeadlineExceeded, true},
		{&client.Error{Status: http.StatusServiceUnavailable}, true},
		{&client.Error{Status: http.StatusBadGateway}, true},
		{&client.Error{Status: http.StatusUnauthorized}, false},
		{&client.Error{Status: http.StatusForbidden}, false},
		{&client.Error{Status: http.StatusNotFound}, false},
	} {
		if got := Retryable(c.err); got != c.want {
			t.Errorf("Retryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
