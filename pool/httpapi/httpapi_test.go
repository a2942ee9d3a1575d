package httpapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"rmem/pool"
)

func TestDecodeNamesField(t *testing.T) {
	for _, tt := range []struct {
		body, field string
	}{
		{`{"slabs": "two", "replicas": 1}`, "slabs"},
		{`{"slabs": 2, "replicas": 1, "extra": true}`, "extra"},
	} {
		var req pool.AllocateRequest
		err := DecodeBytes([]byte(tt.body), &req)
		var fe *pool.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("%s: %v, want a FieldError on %q", tt.body, err, tt.field)
		}
	}
	for _, body := range []string{``, `{`, `{"slabs":1}{}`, `[1]`, `{"ttl": "soon"}`} {
		var req pool.CreateLeaseRequest
		if err := DecodeBytes([]byte(body), &req); !errors.Is(err, pool.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", body, err)
		}
	}
}

func TestAuth(t *testing.T) {
	h := Auth("s3cret", false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	for _, tt := range []struct {
		hdr  string
		want int
	}{
		{"Bearer s3cret", 204}, {"Bearer wrong", 401}, {"", 401}, {"Basic s3cret", 401}, {"Bearer ", 401},
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/v1/status", nil)
		if tt.hdr != "" {
			r.Header.Set("Authorization", tt.hdr)
		}
		h.ServeHTTP(rec, r)
		if rec.Code != tt.want {
			t.Errorf("%q: %d, want %d", tt.hdr, rec.Code, tt.want)
		}
		if rec.Code == 401 && !strings.Contains(rec.Body.String(), `"error"`) {
			t.Errorf("401 without a JSON error: %s", rec.Body)
		}
	}
	empty := Auth("", false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer ")
	empty.ServeHTTP(rec, r)
	if rec.Code != 401 {
		t.Fatalf("empty token accepted: %d", rec.Code)
	}
}

func TestStatusRoundTrip(t *testing.T) {
	for _, s := range statusOf {
		if got := ErrorFor(Status(s.err)); Status(got) != s.status {
			t.Errorf("%v: status %d maps back to %v", s.err, s.status, got)
		}
	}
}

// FuzzDecode feeds arbitrary bodies to every request type: Decode must
// return a value or an ErrInvalid error, never panic, and accepted requests
// must survive their own validation without panicking.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"slabs":2,"replicas":2}`, `{"agent":"a","node":"n","pid":1,"ttl":"30s"}`, `{"ttl":1500}`,
		`{"id":"s1","instance":"i","addrs":{"tcp":"127.0.0.1:1"},"slab_size":4096,"slabs":4}`,
		`{"server":"s1"}`, `{"indexes":[1,2,3],"instance":"x"}`, `{"slabs":[{"index":1,"key":"00"}]}`, `{`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		targets := []any{
			&pool.AllocateRequest{}, &pool.CreateLeaseRequest{}, &pool.ServerInfo{}, &pool.ReplaceRequest{},
			&pool.Heartbeat{}, &pool.GrantRequest{}, &pool.FreeRequest{},
		}
		for _, v := range targets {
			err := DecodeBytes(body, v)
			if err != nil {
				if !errors.Is(err, pool.ErrInvalid) {
					t.Fatalf("%T: error %v does not wrap ErrInvalid", v, err)
				}
				continue
			}
			if val, ok := v.(interface{ Validate() error }); ok {
				if err := val.Validate(); err != nil && !errors.Is(err, pool.ErrInvalid) {
					t.Fatalf("%T: validation error %v does not wrap ErrInvalid", v, err)
				}
			}
		}
	})
}
