// Package memdtest starts real memd processes for the end-to-end tests in
// tests/: it builds the binary once per test binary, finds free loopback
// ports, runs processes with their output captured in the test log, and
// waits for conditions by polling.
//
// It is not for unit tests (use pool/pooltest) and has no fakes.
package memdtest
