package testcerts

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// A client certificate carries its organizations (Kubernetes groups) and
// verifies for client authentication only.
func TestIssueClientCertificate(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("test-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := Issue(ca, Subject{CommonName: "system:node:n1", Organizations: []string{"system:nodes"},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := certs.ParseCert(kp.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert())
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
		t.Errorf("not a valid client certificate: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, CurrentTime: now}); err == nil {
		t.Error("a client certificate verifies for serving")
	}
	if cert.Subject.CommonName != "system:node:n1" || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("subject %v", cert.Subject)
	}
}
