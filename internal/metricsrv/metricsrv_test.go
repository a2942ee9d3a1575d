package metricsrv

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "rmem_test_total", Help: "a test counter"})
	reg.MustRegister(c)
	addr, stop, err := Serve("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "rmem_test_total 0") {
		t.Fatalf("GET /metrics: %d\n%s", resp.StatusCode, body)
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestServeAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, _, err = Serve(ln.Addr().String(), prometheus.NewRegistry())
	var me *Error
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("a taken address: %v", err)
	}
}
