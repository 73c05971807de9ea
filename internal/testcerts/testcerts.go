// Package testcerts issues the certificates that only the test clusters need
// (internal/nodecluster's kube-apiserver and kubelet): certificates for any
// subject, including client certificates whose organizations are Kubernetes
// groups, signed by a pkg/certs CA. The product itself issues serving
// certificates only (certs.CA.Issue).
package testcerts

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// Subject says whom a certificate is for and what it may be used for.
type Subject struct {
	CommonName string
	// Organizations are Kubernetes groups on a client certificate.
	Organizations []string
	// Names are the subject alternative names; those that parse as IP
	// addresses become IP SANs.
	Names []string
	// Usages are the extended key usages (server auth, client auth).
	Usages []x509.ExtKeyUsage
}

// Issue signs a certificate for s with ca, valid from now for validity but
// never past the CA's own expiry.
func Issue(ca *certs.CA, s Subject, now time.Time, validity time.Duration) (certs.KeyPair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: s.CommonName, Organization: s.Organizations},
		ExtKeyUsage: s.Usages,
	}
	certs.SetNames(tmpl, s.Names)
	return ca.Sign(tmpl, now, validity)
}
