package httpapi

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"rmem/pool"
)

// MaxBody bounds a request body.
const MaxBody = 1 << 20

// Auth wraps next so that only requests with "Authorization: Bearer TOKEN"
// (compared in constant time) or, when allowMTLS, a client certificate the
// TLS layer verified, reach it. Others get 401 with a JSON error. An empty
// token accepts no bearer token at all.
func Auth(token string, allowMTLS bool, next http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if allowMTLS && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			next.ServeHTTP(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || len(want) == 0 || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rmem"`)
			WriteError(w, fmt.Errorf("%w: missing or wrong bearer token", pool.ErrUnauthorized))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Decode reads r's JSON body into v. Unknown fields, trailing data, a body
// over MaxBody and type mismatches are errors wrapping pool.ErrInvalid; when
// the decoder can tell, the error is a *pool.FieldError naming the field.
func Decode(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return fmt.Errorf("%w: reading body: %v", pool.ErrInvalid, err)
	}
	if len(body) > MaxBody {
		return fmt.Errorf("%w: body larger than %d bytes", pool.ErrInvalid, MaxBody)
	}
	return DecodeBytes(body, v)
}

// DecodeBytes is Decode over a byte slice.
func DecodeBytes(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the JSON body", pool.ErrInvalid)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the JSON body", pool.ErrInvalid)
	}
	return nil
}

func decodeError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return &pool.FieldError{Field: field, Msg: fmt.Sprintf("want a JSON %s, got %s", te.Type, te.Value)}
	case errors.As(err, &se):
		return fmt.Errorf("%w: malformed JSON at byte %d: %v", pool.ErrInvalid, se.Offset, se)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: empty or truncated JSON body", pool.ErrInvalid)
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return &pool.FieldError{Field: strings.Trim(f, `"`), Msg: "unknown field"}
	}
	// Errors from a field's UnmarshalJSON (pool.Duration) do not say which
	// field; json wraps them without context.
	return fmt.Errorf("%w: %v", pool.ErrInvalid, err)
}

// statusOf maps an error to an HTTP status.
var statusOf = []struct {
	err    error
	status int
}{
	{pool.ErrNotFound, http.StatusNotFound},
	{pool.ErrInvalid, http.StatusBadRequest},
	{pool.ErrUnauthorized, http.StatusUnauthorized},
	{pool.ErrForbidden, http.StatusForbidden},
	{pool.ErrNoCapacity, http.StatusInsufficientStorage},
	{pool.ErrLeaseExpired, http.StatusGone},
	{pool.ErrConflict, http.StatusConflict},
	{pool.ErrServerDead, http.StatusConflict},
	{pool.ErrStaleInstance, http.StatusConflict},
	{pool.ErrGrantFailed, http.StatusBadGateway},
	{pool.ErrNotLeader, http.StatusServiceUnavailable},
	{pool.ErrStaleLeader, http.StatusConflict},
	{pool.ErrCoordinatorOff, http.StatusServiceUnavailable},
}

// Status returns the HTTP status for err (500 for unknown errors).
func Status(err error) int {
	for _, s := range statusOf {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return http.StatusInternalServerError
}

// ErrorFor returns the pool sentinel for an HTTP status, or nil.
func ErrorFor(status int) error {
	for _, s := range statusOf {
		if s.status == status {
			return s.err
		}
	}
	return nil
}

// WriteError writes err as a JSON APIError with its status.
func WriteError(w http.ResponseWriter, err error) {
	body := pool.APIError{Error: err.Error()}
	var fe *pool.FieldError
	if errors.As(err, &fe) {
		body.Field = fe.Field
	}
	WriteJSON(w, Status(err), body)
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

// NotFound is the handler for unknown routes: 404 with a JSON error.
// Registered as the "/" catch-all, it also answers a known path with
// another method (net/http would answer 405 in text).
func NotFound(w http.ResponseWriter, r *http.Request) {
	WriteError(w, fmt.Errorf("%w: no route %s %s", pool.ErrNotFound, r.Method, r.URL.Path))
}
