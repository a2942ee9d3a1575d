// Package httpapi holds what the coordinator's control API and the memory
// server's control endpoint share: bearer-token (or mTLS) authentication,
// strict JSON request decoding whose errors name the bad field, and the
// mapping between pool errors and HTTP status codes, in both directions.
//
// It is not for routes or handlers of its own: pool/coord and pool/memserver
// own their routes; pool/client is the Go client.
package httpapi
