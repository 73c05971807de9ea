package certs

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"
)

func TestIssueChainsToCA(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("test-ca", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"webhook.ns.svc", "127.0.0.1"}, now, 100*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM); err != nil {
		t.Fatalf("certificate and key do not pair: %v", err)
	}
	cert, err := ParseCert(kp.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert())
	for _, name := range []string{"webhook.ns.svc", "127.0.0.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, CurrentTime: now}); err != nil {
			t.Errorf("does not verify for %s: %v", name, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.ns.svc", CurrentTime: now}); err == nil {
		t.Error("verifies for a name it was not issued for")
	}
	if !cert.NotAfter.Equal(ca.Cert().NotAfter) {
		t.Errorf("serving certificate outlives its CA: %s > %s", cert.NotAfter, ca.Cert().NotAfter)
	}
}

func TestLoadCA(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("test-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.KeyPair)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert().Equal(ca.Cert()) {
		t.Error("loaded a different certificate")
	}
	other, _ := NewCA("other", now, time.Hour)
	tests := map[string]KeyPair{
		"mismatched key": {CertPEM: ca.CertPEM, KeyPEM: other.KeyPEM},
		"no key":         {CertPEM: ca.CertPEM},
		"garbage cert":   {CertPEM: []byte("nope"), KeyPEM: ca.KeyPEM},
	}
	for name, kp := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := LoadCA(kp); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	leaf, _ := ca.Issue([]string{"x"}, now, time.Hour)
	if _, err := LoadCA(leaf); err == nil {
		t.Error("accepted a serving certificate as a CA")
	}
}
