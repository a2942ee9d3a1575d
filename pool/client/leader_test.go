package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"rmem/pool"
	"rmem/pool/client"
	"rmem/pool/httpapi"
)

// TestFailoverFollowsLeaderHint: a follower's 503 names the leader; the
// client goes there, learns it, and sends there from then on.
func TestFailoverFollowsLeaderHint(t *testing.T) {
	var leaderHits, followerHits atomic.Int64
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaderHits.Add(1)
		httpapi.WriteJSON(w, 200, pool.Status{SlabSize: 7})
	}))
	defer leader.Close()
	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		followerHits.Add(1)
		httpapi.WriteJSON(w, 503, pool.APIError{Error: pool.ErrNotLeader.Error() + ": f", Leader: leader.URL})
	}))
	defer follower.Close()
	c, err := client.New(follower.URL, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	for range 3 {
		st, err := c.Status(context.Background())
		if err != nil || st.SlabSize != 7 {
			t.Fatalf("%+v %v", st, err)
		}
	}
	if followerHits.Load() != 1 || leaderHits.Load() != 3 || c.URL() != leader.URL {
		t.Fatalf("follower %d, leader %d hits, now at %s", followerHits.Load(), leaderHits.Load(), c.URL())
	}
}

// TestFailoverSkipsDeadCoordinator: a coordinator that refuses
// connections is skipped for the next in the list; with none leading, the
// error comes after RetryFor and says what each answered.
func TestFailoverSkipsDeadCoordinator(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, 200, pool.Status{SlabSize: 9})
	}))
	c, err := client.New(dead+","+live.URL, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Status(context.Background()); err != nil || st.SlabSize != 9 {
		t.Fatalf("%+v %v", st, err)
	}
	c.CloseIdleConnections()
	live.Close()

	var noneHits atomic.Int64
	none := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		noneHits.Add(1)
		httpapi.WriteJSON(w, 503, pool.APIError{Error: pool.ErrNotLeader.Error() + ": electing"})
	}))
	defer none.Close()
	c2, _ := client.New(dead+","+none.URL, client.Options{RetryFor: 500 * time.Millisecond})
	defer c2.CloseIdleConnections()
	start := time.Now()
	_, err = c2.Status(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no leader coordinator answered within") || !strings.Contains(err.Error(), "not the leader") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("got %v", err)
	}
	// It gives up only once RetryFor has passed (retryWait), never early
	// because the next back-off would overrun it.
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Fatalf("gave up after %v, before RetryFor (500ms)", d)
	}
	if n := noneHits.Load(); n < 3 {
		t.Fatalf("the live coordinator was asked %d times in RetryFor, want a round per back-off (3 or more)", n)
	}
}

// TestFailoverNoResendOfAppliedPost: a POST whose connection broke after
// it was sent (maybe applied) is not sent to another coordinator.
func TestFailoverNoResendOfAppliedPost(t *testing.T) {
	var hits atomic.Int64
	breaker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer breaker.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(100)
		httpapi.WriteJSON(w, 201, pool.AllocateResponse{})
	}))
	defer other.Close()
	c, _ := client.New(breaker.URL+","+other.URL, client.Options{})
	defer c.CloseIdleConnections()
	if _, err := c.Allocate(context.Background(), "l", pool.AllocateRequest{Slabs: 1, Replicas: 1}); err == nil {
		t.Fatal("an allocation whose answer was lost succeeded")
	}
	if hits.Load() != 1 {
		t.Fatalf("hits %d: the POST was sent again", hits.Load())
	}
	// A renewal may be applied twice: it goes on to the other.
	if _, err := c.Renew(context.Background(), "l", pool.RenewRequest{}); err != nil {
		t.Fatalf("renewal: %v", err)
	}
}

func TestParseURLs(t *testing.T) {
	for _, bad := range []string{"", "ftp://a:1", "http://a:1,http://a:1", "http://a:1/x", "http://a:1,,http://b:2", "http://u@a:1"} {
		if _, err := client.ParseURLs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	us, err := client.ParseURLs("http://a:1/, https://b:2")
	if err != nil || len(us) != 2 || us[0].String() != "http://a:1" || us[1].String() != "https://b:2" {
		t.Fatalf("%v %v", us, err)
	}
}

// FuzzParseURLs: coordinator lists come from flags and config files:
// anything parses to clean URLs or is refused.
func FuzzParseURLs(f *testing.F) {
	for _, s := range []string{"http://a:1", "http://a:1,https://[::1]:2/", "x", "http://a:1,http://a:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		us, err := client.ParseURLs(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, u := range us {
			if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || seen[u.String()] {
				t.Fatalf("%q gave %v", s, us)
			}
			seen[u.String()] = true
		}
	})
}
