package webhook

import (
	"context"
	"crypto/tls"
	"net/url"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/addon-heartbeat/addon-heartbeat/internal/certexpiry"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// The webhook exports the notAfter of the certificate it serves from
// --cert-dir (cert-manager's and OpenShift's service CA's mode: the suite's
// webhook), and follows a renewal without a restart. (test/chart checks the
// self-managed mode's.)
func TestServedCertificateExpiryExported(t *testing.T) {
	u, err := url.Parse(webhookURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, webhookTLS)
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if got := metricValue(t, certexpiry.MetricNotAfter); got != float64(served.NotAfter.Unix()) {
		t.Errorf("%s = %v, want the served certificate's %d", certexpiry.MetricNotAfter, got, served.NotAfter.Unix())
	}

	// A second webhook on a folder of its own: while it runs, the process
	// exports its certificate, and the one renewed into the folder.
	now := time.Now()
	ca, err := certs.NewCA("expiry-test-ca", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	first, err := ca.Issue([]string{"127.0.0.1"}, now, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := ca.Issue([]string{"127.0.0.1"}, now, 20*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeKeyPair(t, dir, first)
	startDirWebhook(t, dir)
	for _, kp := range []certs.KeyPair{first, renewed} {
		writeKeyPair(t, dir, kp)
		cert, err := certs.ParseCert(kp.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		want := float64(cert.NotAfter.Unix())
		var last float64
		err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
			last = metricValue(t, certexpiry.MetricNotAfter)
			return last == want, nil
		})
		if err != nil {
			t.Fatalf("%s stayed %v, want %v", certexpiry.MetricNotAfter, last, want)
		}
	}
}

// metricValue is the value of the unlabelled gauge name at the suite's
// metrics endpoint (0 when absent).
func metricValue(t *testing.T, name string) float64 {
	t.Helper()
	for _, m := range scrape(t)[name].GetMetric() {
		return m.GetGauge().GetValue()
	}
	return 0
}
