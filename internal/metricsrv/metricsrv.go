// Package metricsrv serves a Prometheus registry's /metrics over TCP, for a
// daemon's --metrics-listen (memagent serve, run and mount). It is not for
// the daemons' other endpoints: memd's control API and the agent's admin
// socket have their own muxes (and the admin socket its peer checks).
package metricsrv

import (
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Error is the error of a listener that could not start on the address
// asked for; Err is the listener's.
type Error struct{ Err error }

func (e *Error) Error() string { return "metrics listener: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Serve serves GET /metrics from g on addr (HOST:PORT; port 0 picks one)
// until stop is called, and returns the address it listens on.
func Serve(addr string, g prometheus.Gatherer) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, &Error{err}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { hs.Serve(ln); close(done) }()
	return ln.Addr().String(), func() { hs.Close(); <-done }, nil
}
