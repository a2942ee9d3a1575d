package tcp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

	"rmem/rdma"
	"rmem/rdma/rdmatest"
)

// testTLS returns a server config with a fresh self-signed certificate for
// 127.0.0.1 and a client config that trusts only it.
func testTLS(t *testing.T) (srv, cli *tls.Config) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "rmem test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	srv = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS13}
	cli = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	return srv, cli
}

func TestConformanceTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	rdmatest.RunConformance(t, func(t *testing.T) *rdmatest.Env {
		srv, cli := testTLS(t)
		e := newEnv(t, rdma.ListenOptions{TLS: srv}, rdma.DialOptions{TLS: cli})
		e.AllocsReason = "crypto/tls allocates in Conn.Read (readFromUntil), once per record"
		return e
	})
}

func TestTLSMismatch(t *testing.T) {
	srv, cli := testTLS(t)
	e := newEnv(t, rdma.ListenOptions{TLS: srv}, rdma.DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := Dial(ctx, e.Addr, rdma.DialOptions{}); !errors.Is(err, rdma.ErrTransport) && !errors.Is(err, rdma.ErrProtocol) {
		t.Fatalf("plain client to a TLS server: %v", err)
	}
	_, other := testTLS(t) // trusts another certificate
	if _, err := Dial(ctx, e.Addr, rdma.DialOptions{TLS: other}); err == nil {
		t.Fatal("client accepted an untrusted server certificate")
	}
	c, err := Dial(ctx, e.Addr, rdma.DialOptions{TLS: cli})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	plain := newEnv(t, rdma.ListenOptions{}, rdma.DialOptions{})
	if _, err := Dial(ctx, plain.Addr, rdma.DialOptions{TLS: cli}); err == nil {
		t.Fatal("TLS client accepted a plain server")
	}
}
