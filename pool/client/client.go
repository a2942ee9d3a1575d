package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"rmem/pool"
	"rmem/pool/httpapi"
)

// DefaultURL is the coordinator's default control address (memd serve with
// no flags).
const DefaultURL = "http://127.0.0.1:7470"

// Options configure a Client.
type Options struct {
	Token   string        // bearer token
	TLS     *tls.Config   // for https:// URLs (mTLS: set Certificates)
	Timeout time.Duration // per attempt; default 30s
	// RetryFor bounds how long a request looks for the leader coordinator
	// (default 15s; negative: one attempt). The context bounds it too.
	RetryFor time.Duration
	// DialContext, when set, opens the connections (tests reach
	// coordinators in network namespaces with it).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client talks to the pool's coordinators (or to one memory server's
// control API). Given several coordinator URLs, it sends each request to
// the one it believes leads and, when that one is down or answers 503
// not-leader, to the leader it names or the next one, with bounded
// back-off (see Do).
type Client struct {
	token    string
	hc       *http.Client
	retryFor time.Duration

	mu      sync.Mutex
	urls    []*url.URL // the coordinators; leader hints add to them
	cur     int        // the one believed to lead
	secrets map[pool.LeaseID]string
}

// ParseURLs parses a coordinator URL or a comma-separated list of them,
// each http(s)://HOST:PORT (a trailing slash is dropped; no path, query
// or duplicates).
func ParseURLs(s string) ([]*url.URL, error) {
	var out []*url.URL
	seen := map[string]bool{}
	for _, one := range strings.Split(s, ",") {
		one = strings.TrimRight(strings.TrimSpace(one), "/")
		u, err := url.Parse(one)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("client: coordinator URL %q: want http://HOST:PORT or https://HOST:PORT (several: comma-separated)", one)
		}
		if seen[u.String()] {
			return nil, fmt.Errorf("client: coordinator URL %q is listed twice", one)
		}
		seen[u.String()] = true
		out = append(out, u)
	}
	return out, nil
}

// New returns a client of the API at base: one URL (e.g.
// "http://127.0.0.1:7470") or a comma-separated list of the coordinators'.
func New(base string, opts Options) (*Client, error) {
	urls, err := ParseURLs(base)
	if err != nil {
		return nil, err
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.RetryFor == 0 {
		opts.RetryFor = 15 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = opts.TLS
	tr.MaxIdleConnsPerHost = 64
	// A coordinator that is down is found in seconds, not at the
	// default 30s dial timeout.
	tr.DialContext = (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext
	if opts.DialContext != nil {
		tr.DialContext = opts.DialContext
	}
	return &Client{urls: urls, token: opts.Token, retryFor: opts.RetryFor, hc: &http.Client{Transport: tr, Timeout: opts.Timeout}}, nil
}

// URL returns the base URL the client sends to now (the leader, as far as
// it knows).
func (c *Client) URL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.urls[c.cur].String()
}

// URLs returns every coordinator URL the client knows.
func (c *Client) URLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.urls))
	for i, u := range c.urls {
		out[i] = u.String()
	}
	return out
}

// CloseIdleConnections closes idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Error is an error response of the API. It wraps the pool sentinel of its
// status (pool.ErrNotFound for 404, ...).
type Error struct {
	Status  int
	Message string
	Field   string // for 400: the request field at fault
	Leader  string // for 503 not-leader: the leader's URL, when known
	URL     string // the coordinator that answered
	err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// Unwrap returns the pool sentinel for the status, if any.
func (e *Error) Unwrap() error { return e.err }

// ErrEmptyToken: a token file holds no token (yet).
var ErrEmptyToken = errors.New("client: token file is empty")

// LoadToken reads a token file (the first line, trimmed).
func LoadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("client: token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("%w: %s", ErrEmptyToken, path)
	}
	return tok, nil
}

// Do sends method path with body (nil: none) as JSON and decodes the
// response into out (nil: discard). GET, PUT, DELETE and HEAD are taken as
// idempotent (see DoIdempotent).
//
// Leader following: a 503 not-leader answer is retried on the leader it
// names (added to the known URLs) or on the next coordinator; a
// coordinator that cannot be reached is skipped for the next one when the
// client knows several (after a request was sent, only for idempotent
// requests: a POST that may have been applied is not sent twice). After a
// round over every coordinator it backs off (50ms doubling to 1s) and
// tries again until Options.RetryFor has passed (a last round at its end); then the error says what
// each coordinator answered.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	return c.do(ctx, method, path, body, out, idempotent(method), nil)
}

func idempotent(method string) bool {
	return method == "GET" || method == "PUT" || method == "DELETE" || method == "HEAD"
}

// DoIdempotent is Do for a request that may be applied twice (a renewal,
// a heartbeat): it is retried elsewhere even after it was sent.
func (c *Client) DoIdempotent(ctx context.Context, method, path string, body, out any) error {
	return c.do(ctx, method, path, body, out, true, nil)
}

// SetLeaseSecret gives the client the secret of lease id (pool.Lease.Secret),
// which it sends with every request about that lease. CreateLease does it
// for the leases it creates; an agent taking over the lease of its
// predecessor calls it with the secret that one kept.
func (c *Client) SetLeaseSecret(id pool.LeaseID, secret string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.secrets == nil {
		c.secrets = map[pool.LeaseID]string{}
	}
	if secret == "" {
		delete(c.secrets, id)
		return
	}
	c.secrets[id] = secret
}

// LeaseSecret returns the secret the client holds for lease id, or "".
func (c *Client) LeaseSecret(id pool.LeaseID) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secrets[id]
}

// leaseDo is do for a request about lease id: with its secret, when known.
func (c *Client) leaseDo(ctx context.Context, id pool.LeaseID, method, path string, body, out any, idem bool) error {
	var hdr http.Header
	if secret := c.LeaseSecret(id); secret != "" {
		hdr = http.Header{pool.LeaseSecretHeader: {secret}}
	}
	return c.do(ctx, method, path, body, out, idem, hdr)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any, idem bool, hdr http.Header) error {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		payload = b
	}
	deadline := time.Now().Add(c.retryFor)
	backoff := 50 * time.Millisecond
	tried := map[string]bool{} // this round
	var seen []string          // what each answered, for the final error
	var hint string
	for attempt := 1; ; attempt++ {
		u := c.pick(hint, tried)
		hint = ""
		tried[u] = true
		err := c.once(ctx, u, method, path, body != nil, payload, out, hdr)
		if err == nil {
			return nil
		}
		retry := false
		var ae *Error
		var oe *net.OpError
		switch {
		case errors.As(err, &ae) && errors.Is(ae, pool.ErrNotLeader):
			retry, hint = true, ae.Leader
		case errors.As(err, &ae):
		case ctx.Err() != nil:
		case errors.As(err, &oe) && oe.Op == "dial":
			retry = c.count() > 1
		default:
			retry = idem && c.count() > 1
		}
		seen = append(seen, fmt.Sprintf("%s: %v", u, err))
		if !retry || c.retryFor < 0 {
			if len(seen) > 1 {
				return fmt.Errorf("client: %s %s: no leader coordinator answered in %d tries (%s): %w", method, path, attempt, strings.Join(last(seen, 4), "; "), err)
			}
			return err
		}
		if hint != "" && tried[hint] {
			hint = "" // told to go where we were refused this round: wait
		}
		if hint == "" && c.allTried(tried) {
			wait, giveUp := retryWait(time.Now(), deadline, backoff, time.Duration(rand.Int64N(int64(backoff/2+1))))
			if giveUp {
				return fmt.Errorf("client: %s %s: no leader coordinator answered within %v (%d tries: %s): %w", method, path, c.retryFor, attempt, strings.Join(last(seen, 4), "; "), err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("client: %s %s: %w (looking for the leader: %s)", method, path, ctx.Err(), strings.Join(last(seen, 4), "; "))
			case <-time.After(wait):
			}
			backoff = min(2*backoff, time.Second)
			clear(tried)
		}
	}
}

// retryWait decides, after a round over every coordinator at now, how
// long to back off before the next round (backoff plus jitter, cut short
// at deadline so that the last round runs at the deadline) or whether to
// give up: only once the deadline has passed, so a request looks for the
// leader for all of RetryFor however long its rounds take.
func retryWait(now, deadline time.Time, backoff, jitter time.Duration) (wait time.Duration, giveUp bool) {
	left := deadline.Sub(now)
	if left <= 0 {
		return 0, true
	}
	return min(backoff+jitter, left), false
}

func last(s []string, n int) []string { return s[max(0, len(s)-n):] }

func (c *Client) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.urls)
}

func (c *Client) allTried(tried map[string]bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, u := range c.urls {
		if !tried[u.String()] {
			return false
		}
	}
	return true
}

// pick returns the URL to try: the hint (learnt if new), else the current
// one, else the next untried one.
func (c *Client) pick(hint string, tried map[string]bool) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hint != "" {
		if hu, err := ParseURLs(hint); err == nil && len(hu) == 1 {
			for i, u := range c.urls {
				if u.String() == hu[0].String() {
					c.cur = i
					return u.String()
				}
			}
			c.urls = append(c.urls, hu[0])
			c.cur = len(c.urls) - 1
			return hu[0].String()
		}
	}
	for n := range c.urls {
		i := (c.cur + n) % len(c.urls)
		if !tried[c.urls[i].String()] {
			c.cur = i
			return c.urls[i].String()
		}
	}
	return c.urls[c.cur].String()
}

func (c *Client) once(ctx context.Context, base, method, path string, hasBody bool, payload []byte, out any, hdr http.Header) error {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return err
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("client: %s %s: reading response: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var ae pool.APIError
		if json.Unmarshal(data, &ae) != nil || ae.Error == "" {
			ae.Error = strings.TrimSpace(string(data))
			if ae.Error == "" {
				ae.Error = resp.Status
			}
		}
		sentinel := httpapi.ErrorFor(resp.StatusCode)
		if resp.StatusCode == http.StatusServiceUnavailable && !strings.Contains(ae.Error, pool.ErrNotLeader.Error()) {
			sentinel = pool.ErrCoordinatorOff
		}
		return &Error{Status: resp.StatusCode, Message: ae.Error, Field: ae.Field, Leader: ae.Leader, URL: base, err: sentinel}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("client: %s %s: decoding response: %w", method, path, err)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// Status returns the pool summary.
func (c *Client) Status(ctx context.Context) (pool.Status, error) {
	var v pool.Status
	return v, c.Do(ctx, "GET", "/v1/status", nil, &v)
}

// Coordinators lists the pool's coordinators and says which leads.
func (c *Client) Coordinators(ctx context.Context) (pool.Coordinators, error) {
	var v pool.Coordinators
	return v, c.Do(ctx, "GET", "/v1/coordinators", nil, &v)
}

// Servers lists the memory servers.
func (c *Client) Servers(ctx context.Context) ([]pool.ServerView, error) {
	var v []pool.ServerView
	return v, c.Do(ctx, "GET", "/v1/servers", nil, &v)
}

// Server returns one memory server.
func (c *Client) Server(ctx context.Context, id pool.ServerID) (pool.ServerView, error) {
	var v pool.ServerView
	return v, c.Do(ctx, "GET", "/v1/servers/"+esc(string(id)), nil, &v)
}

// Register registers (or re-registers) a memory server.
func (c *Client) Register(ctx context.Context, info pool.ServerInfo) (pool.Server, error) {
	var v pool.Server
	return v, c.DoIdempotent(ctx, "POST", "/v1/servers", info, &v)
}

// Heartbeat reports a memory server's state.
func (c *Client) Heartbeat(ctx context.Context, id pool.ServerID, hb pool.Heartbeat) error {
	return c.DoIdempotent(ctx, "POST", "/v1/servers/"+esc(string(id))+"/heartbeat", hb, nil)
}

// Leave takes a memory server out of the pool.
func (c *Client) Leave(ctx context.Context, id pool.ServerID) error {
	return c.Do(ctx, "DELETE", "/v1/servers/"+esc(string(id)), nil, nil)
}

// Drain starts (on) or stops draining a server and returns its progress.
func (c *Client) Drain(ctx context.Context, id pool.ServerID, on bool) (pool.DrainView, error) {
	var v pool.DrainView
	op := "/drain"
	if !on {
		op = "/undrain"
	}
	return v, c.DoIdempotent(ctx, "POST", "/v1/servers/"+esc(string(id))+op, nil, &v)
}

// DrainStatus returns a server's drain progress.
func (c *Client) DrainStatus(ctx context.Context, id pool.ServerID) (pool.DrainView, error) {
	var v pool.DrainView
	return v, c.Do(ctx, "GET", "/v1/servers/"+esc(string(id))+"/drain", nil, &v)
}

// Leases lists the leases (agents).
func (c *Client) Leases(ctx context.Context) ([]pool.LeaseView, error) {
	var v []pool.LeaseView
	return v, c.Do(ctx, "GET", "/v1/leases", nil, &v)
}

// Lease returns one lease as the admin listing shows it (no secret).
func (c *Client) Lease(ctx context.Context, id pool.LeaseID) (pool.LeaseView, error) {
	var v pool.LeaseView
	return v, c.Do(ctx, "GET", "/v1/leases/"+esc(string(id)), nil, &v)
}

// CreateLease starts a lease. The lease returned carries its Secret, which
// the client keeps and sends with every later request about the lease;
// save it with the lease id to take the lease over after a restart
// (SetLeaseSecret).
func (c *Client) CreateLease(ctx context.Context, req pool.CreateLeaseRequest) (pool.Lease, error) {
	var v pool.Lease
	if err := c.Do(ctx, "POST", "/v1/leases", req, &v); err != nil {
		return v, err
	}
	c.SetLeaseSecret(v.ID, v.Secret)
	return v, nil
}

// Renew renews a lease, reporting how the agent uses it, and returns the
// events about its slabs. The lease in the response carries the secret the
// client holds for it.
func (c *Client) Renew(ctx context.Context, id pool.LeaseID, req pool.RenewRequest) (pool.RenewResponse, error) {
	var v pool.RenewResponse
	err := c.leaseDo(ctx, id, "POST", "/v1/leases/"+esc(string(id))+"/renew", req, &v, true)
	if err == nil {
		v.Lease.Secret = c.LeaseSecret(id)
	}
	return v, err
}

// DeleteLease ends a lease and frees its slabs.
func (c *Client) DeleteLease(ctx context.Context, id pool.LeaseID) error {
	err := c.leaseDo(ctx, id, "DELETE", "/v1/leases/"+esc(string(id)), nil, nil, true)
	if err == nil || errors.Is(err, pool.ErrNotFound) {
		c.SetLeaseSecret(id, "")
	}
	return err
}

// Allocate allocates slabs for a lease.
func (c *Client) Allocate(ctx context.Context, id pool.LeaseID, req pool.AllocateRequest) ([]pool.SlabView, error) {
	var v pool.AllocateResponse
	return v.Slabs, c.leaseDo(ctx, id, "POST", "/v1/leases/"+esc(string(id))+"/slabs", req, &v, false)
}

// LeaseSlabs lists a lease's slabs with their keys.
func (c *Client) LeaseSlabs(ctx context.Context, id pool.LeaseID) ([]pool.SlabView, error) {
	var v pool.AllocateResponse
	return v.Slabs, c.leaseDo(ctx, id, "GET", "/v1/leases/"+esc(string(id))+"/slabs", nil, &v, true)
}

func slabPath(id pool.LeaseID, sid pool.SlabID) string {
	return "/v1/leases/" + esc(string(id)) + "/slabs/" + strconv.FormatUint(uint64(sid), 10)
}

// FreeSlab frees one slab.
func (c *Client) FreeSlab(ctx context.Context, id pool.LeaseID, sid pool.SlabID) error {
	return c.leaseDo(ctx, id, "DELETE", slabPath(id, sid), nil, nil, true)
}

// Replace asks for a replacement of the slab's replica on server from.
func (c *Client) Replace(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) (pool.ReplicaView, error) {
	var v pool.ReplicaView
	return v, c.leaseDo(ctx, id, "POST", slabPath(id, sid)+"/replace", pool.ReplaceRequest{Server: from}, &v, false)
}

// Migrated reports the replica on from copied to its replacement.
func (c *Client) Migrated(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) error {
	return c.leaseDo(ctx, id, "POST", slabPath(id, sid)+"/migrated", pool.MigratedRequest{Server: from}, nil, false)
}

// SlabFilter selects slabs in Slabs; empty fields match all.
type SlabFilter struct {
	Server pool.ServerID
	Agent  string
	Lease  pool.LeaseID
}

// Slabs lists slabs.
func (c *Client) Slabs(ctx context.Context, f SlabFilter) ([]pool.SlabView, error) {
	q := url.Values{}
	if f.Server != "" {
		q.Set("server", string(f.Server))
	}
	if f.Agent != "" {
		q.Set("agent", f.Agent)
	}
	if f.Lease != "" {
		q.Set("lease", string(f.Lease))
	}
	path := "/v1/slabs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var v []pool.SlabView
	return v, c.Do(ctx, "GET", path, nil, &v)
}

// MemServer is the coordinator's client of a memory server's control
// endpoint; it implements coord.SlabServer.
type MemServer struct {
	c   *Client
	hdr http.Header // the server's control secret
}

// NewMemServer returns a client of the memory server at controlURL, which
// registered with the control secret secret (pool.ServerInfo.ControlSecret).
func NewMemServer(controlURL, secret string, opts Options) (*MemServer, error) {
	c, err := New(controlURL, opts)
	if err != nil {
		return nil, err
	}
	return &MemServer{c: c, hdr: http.Header{pool.ControlSecretHeader: {secret}}}, nil
}

// Grant asks for fresh keys on slabs.
func (m *MemServer) Grant(ctx context.Context, instance string, epoch uint64, idx []pool.SlabIndex) ([]pool.Key, error) {
	var v pool.GrantResponse
	if err := m.c.do(ctx, "POST", "/v1/memserver/grant", pool.GrantRequest{Instance: instance, Indexes: idx, Epoch: epoch}, &v, false, m.hdr); err != nil {
		return nil, err
	}
	if len(v.Keys) != len(idx) {
		return nil, errors.New("client: memory server returned the wrong number of keys")
	}
	return v.Keys, nil
}

// Free asks for keys to be revoked and slabs zeroed.
func (m *MemServer) Free(ctx context.Context, instance string, slabs []pool.FreeEntry) error {
	return m.c.do(ctx, "POST", "/v1/memserver/free", pool.FreeRequest{Instance: instance, Slabs: slabs}, nil, false, m.hdr)
}

// ProbeInstance asks which server instance answers at the control URL
// (GET /v1/memserver); it implements coord.InstanceProber.
func (m *MemServer) ProbeInstance(ctx context.Context) (string, error) {
	var v pool.ServerInfo
	if err := m.c.Do(ctx, "GET", "/v1/memserver", nil, &v); err != nil {
		return "", err
	}
	return v.Instance, nil
}

// CloseIdleConnections closes idle keep-alive connections.
func (m *MemServer) CloseIdleConnections() { m.c.CloseIdleConnections() }
