// Package certs creates the webhook's certificate authority and serving
// certificates (self-managed mode) as PEM. It is pure crypto: no files, no
// API calls. ECDSA P-256 keys; serial numbers are random.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// KeyPair is a certificate and its private key, both PEM-encoded.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// CA is a certificate authority that can issue serving certificates.
type CA struct {
	KeyPair
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// clockSkew backdates NotBefore so that a certificate is valid at once on a
// node whose clock is slightly behind.
const clockSkew = 5 * time.Minute

// NewCA creates a self-signed CA valid from now for validity.
func NewCA(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{KeyPair: KeyPair{CertPEM: encodeCert(der), KeyPEM: keyPEM}, cert: cert, key: key}, nil
}

// LoadCA parses a CA from PEM, as stored in a Secret.
func LoadCA(kp KeyPair) (*CA, error) {
	cert, err := ParseCert(kp.CertPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate: not a CA")
	}
	block, _ := pem.Decode(kp.KeyPEM)
	if block == nil {
		return nil, errors.New("CA key: no PEM block")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	return &CA{KeyPair: kp, cert: cert, key: key}, nil
}

// Cert is the CA's parsed certificate.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// Issue signs a serving certificate for dnsNames (and IP addresses, when a
// name parses as one), valid from now for validity but never past the CA's
// own expiry.
func (ca *CA) Issue(dnsNames []string, now time.Time, validity time.Duration) (KeyPair, error) {
	if len(dnsNames) == 0 {
		return KeyPair{}, errors.New("a serving certificate needs at least one name")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsNames[0]},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	SetNames(tmpl, dnsNames)
	return ca.Sign(tmpl, now, validity)
}

// SetNames adds names to tmpl's subject alternative names: those that parse
// as IP addresses as IP SANs, the others as DNS names.
func SetNames(tmpl *x509.Certificate, names []string) {
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
}

// Sign signs tmpl (its subject, names and extended key usages) with a new
// ECDSA P-256 key: it sets the serial number, the key usage, and the
// validity, from now (backdated by the clock-skew allowance) for validity
// but never past the CA's own expiry.
func (ca *CA) Sign(tmpl *x509.Certificate, now time.Time, validity time.Duration) (KeyPair, error) {
	name := tmpl.Subject.CommonName
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generating the key of %s: %w", name, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return KeyPair{}, err
	}
	t := *tmpl
	t.SerialNumber = serial
	t.NotBefore = now.Add(-clockSkew)
	t.NotAfter = minTime(now.Add(validity), ca.cert.NotAfter)
	t.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, &t, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("signing the certificate of %s: %w", name, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// ParseCert parses the first certificate in PEM data.
func ParseCert(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating a serial number: %w", err)
	}
	return n, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// RenewAt is when a certificate should be replaced: after two thirds of its
// lifetime, counted from when it was made here (NotBefore is backdated by the
// clock-skew allowance, which is not part of the lifetime).
func RenewAt(cert *x509.Certificate) time.Time {
	issued := cert.NotBefore.Add(clockSkew)
	if issued.After(cert.NotAfter) {
		issued = cert.NotBefore
	}
	return issued.Add(cert.NotAfter.Sub(issued) * 2 / 3)
}

// ParseCerts parses every certificate in PEM data, such as a CA bundle,
// skipping other blocks.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return out, nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		out = append(out, c)
	}
}

// EncodeCerts is the PEM bundle of certs, in order.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, encodeCert(c.Raw)...)
	}
	return out
}
