package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
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
	Timeout time.Duration // per request; default 30s
}

// Client talks to one coordinator (or memory server) control API.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// New returns a client of the API at base (e.g. "http://127.0.0.1:7470").
func New(base string, opts Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: coordinator URL %q: want http://HOST:PORT or https://HOST:PORT", base)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = opts.TLS
	tr.MaxIdleConnsPerHost = 64
	return &Client{base: u, token: opts.Token, hc: &http.Client{Transport: tr, Timeout: opts.Timeout}}, nil
}

// URL returns the base URL.
func (c *Client) URL() string { return c.base.String() }

// CloseIdleConnections closes idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Error is an error response of the API. It wraps the pool sentinel of its
// status (pool.ErrNotFound for 404, ...).
type Error struct {
	Status  int
	Message string
	Field   string // for 400: the request field at fault
	err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// Unwrap returns the pool sentinel for the status, if any.
func (e *Error) Unwrap() error { return e.err }

// LoadToken reads a token file (the first line, trimmed).
func LoadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("client: token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("client: token file %s is empty", path)
	}
	return tok, nil
}

// Do sends method path with body (nil: none) as JSON and decodes the
// response into out (nil: discard).
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
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
		return &Error{Status: resp.StatusCode, Message: ae.Error, Field: ae.Field, err: httpapi.ErrorFor(resp.StatusCode)}
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
	return v, c.Do(ctx, "POST", "/v1/servers", info, &v)
}

// Heartbeat reports a memory server's state.
func (c *Client) Heartbeat(ctx context.Context, id pool.ServerID, hb pool.Heartbeat) error {
	return c.Do(ctx, "POST", "/v1/servers/"+esc(string(id))+"/heartbeat", hb, nil)
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
	return v, c.Do(ctx, "POST", "/v1/servers/"+esc(string(id))+op, nil, &v)
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

// CreateLease starts a lease.
func (c *Client) CreateLease(ctx context.Context, req pool.CreateLeaseRequest) (pool.Lease, error) {
	var v pool.Lease
	return v, c.Do(ctx, "POST", "/v1/leases", req, &v)
}

// Renew renews a lease, reporting how the agent uses it, and returns the
// events about its slabs.
func (c *Client) Renew(ctx context.Context, id pool.LeaseID, req pool.RenewRequest) (pool.RenewResponse, error) {
	var v pool.RenewResponse
	return v, c.Do(ctx, "POST", "/v1/leases/"+esc(string(id))+"/renew", req, &v)
}

// DeleteLease ends a lease and frees its slabs.
func (c *Client) DeleteLease(ctx context.Context, id pool.LeaseID) error {
	return c.Do(ctx, "DELETE", "/v1/leases/"+esc(string(id)), nil, nil)
}

// Allocate allocates slabs for a lease.
func (c *Client) Allocate(ctx context.Context, id pool.LeaseID, req pool.AllocateRequest) ([]pool.SlabView, error) {
	var v pool.AllocateResponse
	return v.Slabs, c.Do(ctx, "POST", "/v1/leases/"+esc(string(id))+"/slabs", req, &v)
}

// LeaseSlabs lists a lease's slabs with their keys.
func (c *Client) LeaseSlabs(ctx context.Context, id pool.LeaseID) ([]pool.SlabView, error) {
	var v pool.AllocateResponse
	return v.Slabs, c.Do(ctx, "GET", "/v1/leases/"+esc(string(id))+"/slabs", nil, &v)
}

func slabPath(id pool.LeaseID, sid pool.SlabID) string {
	return "/v1/leases/" + esc(string(id)) + "/slabs/" + strconv.FormatUint(uint64(sid), 10)
}

// FreeSlab frees one slab.
func (c *Client) FreeSlab(ctx context.Context, id pool.LeaseID, sid pool.SlabID) error {
	return c.Do(ctx, "DELETE", slabPath(id, sid), nil, nil)
}

// Replace asks for a replacement of the slab's replica on server from.
func (c *Client) Replace(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) (pool.ReplicaView, error) {
	var v pool.ReplicaView
	return v, c.Do(ctx, "POST", slabPath(id, sid)+"/replace", pool.ReplaceRequest{Server: from}, &v)
}

// Migrated reports the replica on from copied to its replacement.
func (c *Client) Migrated(ctx context.Context, id pool.LeaseID, sid pool.SlabID, from pool.ServerID) error {
	return c.Do(ctx, "POST", slabPath(id, sid)+"/migrated", pool.MigratedRequest{Server: from}, nil)
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
type MemServer struct{ c *Client }

// NewMemServer returns a client of the memory server at controlURL.
func NewMemServer(controlURL string, opts Options) (*MemServer, error) {
	c, err := New(controlURL, opts)
	if err != nil {
		return nil, err
	}
	return &MemServer{c: c}, nil
}

// Grant asks for fresh keys on slabs.
func (m *MemServer) Grant(ctx context.Context, instance string, idx []pool.SlabIndex) ([]pool.Key, error) {
	var v pool.GrantResponse
	if err := m.c.Do(ctx, "POST", "/v1/memserver/grant", pool.GrantRequest{Instance: instance, Indexes: idx}, &v); err != nil {
		return nil, err
	}
	if len(v.Keys) != len(idx) {
		return nil, errors.New("client: memory server returned the wrong number of keys")
	}
	return v.Keys, nil
}

// Free asks for keys to be revoked and slabs zeroed.
func (m *MemServer) Free(ctx context.Context, instance string, slabs []pool.FreeEntry) error {
	return m.c.Do(ctx, "POST", "/v1/memserver/free", pool.FreeRequest{Instance: instance, Slabs: slabs}, nil)
}

// CloseIdleConnections closes idle keep-alive connections.
func (m *MemServer) CloseIdleConnections() { m.c.CloseIdleConnections() }
