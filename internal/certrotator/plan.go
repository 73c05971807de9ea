// Package certrotator runs the webhook's self-managed certificates: one
// replica (the leader) keeps a CA and a serving certificate in a Secret in the
// webhook's namespace, renews them well before they expire and keeps the
// caBundle of the webhook's own MutatingWebhookConfiguration current; every
// replica serves the certificate from that Secret, from memory, and picks up
// a new one without a restart.
//
// A CA is replaced without an admission failing: the new CA is first added to
// the caBundle next to the old one, and the serving certificate is reissued by
// the new CA only once the webhook configuration trusts it. The old CA stays
// in the bundle until it expires.
//
// Why not open-policy-agent/cert-controller's rotator, which does the same
// job for Gatekeeper: at v0.16.0 a CA rotation issues the new CA and serving
// certificate together and sets the caBundle to the new CA alone, and its
// replicas serve the files of the Secret's volume, which the kubelet
// refreshes up to a minute or more later (its sync period, 1m by default,
// plus its Secret cache). In between, the API server trusts only the new CA
// while the replicas still serve the old certificate, and with failurePolicy
// Fail every opted-in Deployment admission fails. It also looks at the
// certificates every 12 hours where Plan.RecheckAt is exact, and would add
// three modules to the webhook (itself, pkg/errors and go.uber.org/atomic,
// by go mod tidy).
package certrotator

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// Keys of the Secret.
const (
	// KeyCACert and KeyCAKey are the current CA.
	KeyCACert = "ca.crt"
	KeyCAKey  = "ca.key"
	// KeyCABundle holds the CAs the API server must trust: the current CA
	// first, then earlier CAs until they expire. It is what goes into the
	// webhook configuration's caBundle.
	KeyCABundle = "ca-bundle.crt"
	// KeyCert and KeyKey are the serving certificate and its key.
	KeyCert = "tls.crt"
	KeyKey  = "tls.key"
)

// Settings choose the certificates.
type Settings struct {
	// CAValidity and CertValidity are the lifetimes of the CA and of the
	// serving certificate; each is renewed after two thirds of it.
	CAValidity, CertValidity time.Duration
	// DNSNames of the serving certificate (an entry that parses as an IP
	// address becomes an IP SAN).
	DNSNames []string
	// CACommonName names the CA.
	CACommonName string
}

// Validate reports Settings that cannot produce certificates.
func (s Settings) Validate() error {
	var errs []error
	if s.CertValidity <= 0 {
		errs = append(errs, fmt.Errorf("serving certificate validity %s: must be positive", s.CertValidity))
	}
	if s.CAValidity < s.CertValidity {
		errs = append(errs, fmt.Errorf("CA validity %s: must be at least the serving certificate validity %s", s.CAValidity, s.CertValidity))
	}
	if len(s.DNSNames) == 0 {
		errs = append(errs, errors.New("serving certificate DNS names: at least one is required"))
	}
	return errors.Join(errs...)
}

// Plan is the outcome of Next: what the Secret should hold.
type Plan struct {
	// Data is the Secret's desired data.
	Data map[string][]byte
	// Changed tells whether Data differs from the Secret's current data.
	Changed bool
	// RecheckAt is when Next should run again at the latest: the next
	// renewal, or the expiry of an old CA that leaves the bundle.
	RecheckAt time.Time
	// WaitingForTrust is true when the serving certificate is due for
	// reissue by a new CA that the webhook configuration does not trust yet.
	WaitingForTrust bool
}

// Next works out the Secret's data from its current data, the caBundle that
// the webhook configuration holds now and the time. It is pure apart from
// generating keys.
func Next(current map[string][]byte, webhookCABundle []byte, s Settings, now time.Time) (Plan, error) {
	out := map[string][]byte{}
	// The current CA, replaced when missing, unreadable or due.
	ca, err := certs.LoadCA(certs.KeyPair{CertPEM: current[KeyCACert], KeyPEM: current[KeyCAKey]})
	if err != nil || !now.Before(certs.RenewAt(ca.Cert())) {
		if ca, err = certs.NewCA(s.CACommonName, now, s.CAValidity); err != nil {
			return Plan{}, err
		}
	}
	out[KeyCACert], out[KeyCAKey] = ca.CertPEM, ca.KeyPEM

	// The trust bundle: the current CA, then every earlier CA that has not
	// expired (certificates it signed may still be served).
	bundle := []*x509.Certificate{ca.Cert()}
	previous, _ := certs.ParseCerts(current[KeyCABundle]) // an unreadable bundle is rebuilt
	if old, err := certs.ParseCerts(current[KeyCACert]); err == nil {
		previous = append(previous, old...)
	}
	for _, c := range previous {
		if c.IsCA && now.Before(c.NotAfter) && !slices.ContainsFunc(bundle, sameCert(c)) {
			bundle = append(bundle, c)
		}
	}
	out[KeyCABundle] = certs.EncodeCerts(bundle...)

	// The serving certificate.
	serving, usable := servingCert(current, bundle, now)
	trusted := trustsCA(webhookCABundle, ca.Cert())
	// A certificate for the wrong names is no use to the API server: replace
	// it without waiting for trust.
	usable = usable && sameNames(serving, s.DNSNames)
	due := !usable || !now.Before(certs.RenewAt(serving)) || serving.CheckSignatureFrom(ca.Cert()) != nil
	plan := Plan{Data: out}
	switch {
	case due && (!usable || trusted):
		kp, err := ca.Issue(s.DNSNames, now, s.CertValidity)
		if err != nil {
			return Plan{}, err
		}
		out[KeyCert], out[KeyKey] = kp.CertPEM, kp.KeyPEM
		if serving, err = certs.ParseCert(kp.CertPEM); err != nil {
			return Plan{}, fmt.Errorf("parsing the new serving certificate: %w", err)
		}
	default:
		// Keep serving the current certificate: it is not due, or it is due
		// for a new CA that the API server does not trust yet.
		out[KeyCert], out[KeyKey] = current[KeyCert], current[KeyKey]
		plan.WaitingForTrust = due
	}

	plan.RecheckAt = minTime(certs.RenewAt(ca.Cert()), certs.RenewAt(serving))
	for _, c := range bundle[1:] {
		plan.RecheckAt = minTime(plan.RecheckAt, c.NotAfter)
	}
	for _, k := range []string{KeyCACert, KeyCAKey, KeyCABundle, KeyCert, KeyKey} {
		if !bytes.Equal(out[k], current[k]) {
			plan.Changed = true
		}
	}
	return plan, nil
}

// servingCert parses the Secret's serving certificate. usable tells whether
// it can go on being served for now: its key matches, it has not expired and
// it chains to a CA in the bundle.
func servingCert(data map[string][]byte, bundle []*x509.Certificate, now time.Time) (cert *x509.Certificate, usable bool) {
	if _, err := tls.X509KeyPair(data[KeyCert], data[KeyKey]); err != nil {
		return nil, false
	}
	cert, err := certs.ParseCert(data[KeyCert])
	if err != nil {
		return nil, false
	}
	if !now.Before(cert.NotAfter) {
		return cert, false
	}
	return cert, slices.ContainsFunc(bundle, func(ca *x509.Certificate) bool {
		return cert.CheckSignatureFrom(ca) == nil
	})
}

// trustsCA tells whether the PEM bundle contains ca.
func trustsCA(bundle []byte, ca *x509.Certificate) bool {
	certs, err := certs.ParseCerts(bundle)
	return err == nil && slices.ContainsFunc(certs, sameCert(ca))
}

func sameCert(a *x509.Certificate) func(*x509.Certificate) bool {
	return func(b *x509.Certificate) bool { return a.Equal(b) }
}

// sameNames tells whether cert is for exactly names (DNS and IP SANs).
func sameNames(cert *x509.Certificate, names []string) bool {
	have := slices.Clone(cert.DNSNames)
	for _, ip := range cert.IPAddresses {
		have = append(have, ip.String())
	}
	want := slices.Clone(names)
	slices.Sort(have)
	slices.Sort(want)
	return slices.Equal(have, slices.Compact(want))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
