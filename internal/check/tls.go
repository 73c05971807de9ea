package check

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// servedChain completes a TLS handshake over conn and returns the
// certificates the server sent, leaf first. It does not verify them:
// verifyServed does, against the webhook configuration's caBundle, the way
// the API server does, so that a wrong caBundle is told apart from a webhook
// that does not answer.
func servedChain(ctx context.Context, conn net.Conn, serverName string) ([]*x509.Certificate, error) {
	tc := tls.Client(conn, &tls.Config{
		ServerName: serverName,
		MinVersion: tls.VersionTLS12,
		// Verified below against the caBundle, not the system roots.
		InsecureSkipVerify: true, //nolint:gosec // verified by verifyServed
	})
	defer tc.Close()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	chain := tc.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, errors.New("TLS handshake: the server sent no certificate")
	}
	return chain, nil
}

// verifyServed checks that caBundle verifies chain for name at now, as the
// API server does before it sends an admission review. The error says which
// part does not match: the issuer, the name or the validity.
func verifyServed(chain []*x509.Certificate, caBundle []byte, name string, now time.Time) error {
	if len(strings.TrimSpace(string(caBundle))) == 0 {
		return errors.New("the caBundle is empty, so the API server trusts no certificate of the webhook")
	}
	cas, err := certs.ParseCerts(caBundle)
	if err != nil || len(cas) == 0 {
		return fmt.Errorf("the caBundle holds no PEM certificate: %v", err)
	}
	roots := x509.NewCertPool()
	for _, ca := range cas {
		roots.AddCert(ca)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	leaf := chain[0]
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &unknown):
		return fmt.Errorf("the caBundle does not verify the served certificate: it is issued by %q, and the caBundle holds %s",
			leaf.Issuer.CommonName, subjects(cas))
	case errors.As(err, &host):
		return fmt.Errorf("the served certificate is for %s, not %s, the name the API server connects to",
			strings.Join(certNames(leaf), ", "), name)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return fmt.Errorf("the served certificate is valid from %s to %s, not now (%s)",
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	default:
		return fmt.Errorf("the caBundle does not verify the served certificate: %w", err)
	}
}

func subjects(cas []*x509.Certificate) string {
	names := make([]string, len(cas))
	for i, ca := range cas {
		names[i] = fmt.Sprintf("%q", ca.Subject.CommonName)
	}
	return strings.Join(names, ", ")
}

func certNames(c *x509.Certificate) []string {
	names := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		names = []string{"no name (CN " + c.Subject.CommonName + " only)"}
	}
	return names
}
