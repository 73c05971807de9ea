package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

func writeKeyPair(t *testing.T, dir string, kp certs.KeyPair) {
	t.Helper()
	// Key first: the watcher pairs the files on every change, and a new
	// certificate is only accepted once its key is in place.
	for name, data := range map[string][]byte{"tls.key": kp.KeyPEM, "tls.crt": kp.CertPEM} {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// startDirWebhook runs a second webhook (no metrics endpoint of its own)
// serving the certificate files in dir, until the test ends, and returns its
// address once it is ready.
func startDirWebhook(t *testing.T, dir string) string {
	t.Helper()
	opts := options
	opts.CertDir = dir
	opts.MetricsBindAddress = "0"
	opts.HealthProbeBindAddress = freeAddr()
	addr := freeAddr()
	host, port, _ := net.SplitHostPort(addr)
	opts.Host = host
	var err error
	if opts.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	log, _ := logging.New("error")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, opts, env.Config, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second webhook stopped with %v", err)
		}
	})
	if err := waitHTTP("http://"+opts.HealthProbeBindAddress+"/readyz", 200); err != nil {
		t.Fatal(err)
	}
	return addr
}

// servedSerial dials addr trusting only ca and returns the serial number of
// the certificate the server presents.
func servedSerial(addr string, ca *certs.CA) (string, error) {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert())
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// A new certificate written to the cert folder is served without a restart.
func TestServingCertificateReloads(t *testing.T) {
	now := time.Now()
	ca1, err := certs.NewCA("reload-test-ca-1", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := certs.NewCA("reload-test-ca-2", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	first, err := ca1.Issue([]string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ca2.Issue([]string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeKeyPair(t, dir, first)

	addr := startDirWebhook(t, dir)

	want1, _ := certs.ParseCert(first.CertPEM)
	if got, err := servedSerial(addr, ca1); err != nil || got != want1.SerialNumber.String() {
		t.Fatalf("served serial %s (%v), want the first certificate's %s", got, err, want1.SerialNumber)
	}

	writeKeyPair(t, dir, second)
	want2, _ := certs.ParseCert(second.CertPEM)
	var last string
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		got, err := servedSerial(addr, ca2)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = got
		return got == want2.SerialNumber.String(), nil
	})
	if err != nil {
		t.Fatalf("the new certificate was not served without a restart (last: %s)", last)
	}
}
