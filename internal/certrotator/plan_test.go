package certrotator

import (
	"crypto/x509"
	"maps"
	"testing"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

var (
	t0       = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	settings = Settings{CAValidity: 30 * 24 * time.Hour, CertValidity: 9 * 24 * time.Hour, DNSNames: []string{"svc.ns.svc", "127.0.0.1"}, CACommonName: "test-ca"}
)

// step runs Next and fails the test on error.
func step(t *testing.T, data map[string][]byte, trusted []byte, now time.Time) Plan {
	t.Helper()
	p, err := Next(data, trusted, settings, now)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func cert(t *testing.T, pem []byte) *x509.Certificate {
	t.Helper()
	c, err := certs.ParseCert(pem)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func bundle(t *testing.T, data map[string][]byte) []*x509.Certificate {
	t.Helper()
	b, err := certs.ParseCerts(data[KeyCABundle])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNext(t *testing.T) {
	// A steady state at t0: certificates made and trusted.
	initial := step(t, nil, nil, t0)
	steady := initial.Data
	// At day 19 the serving certificate was renewed (the CA is due at day 20).
	renewed := step(t, steady, steady[KeyCABundle], t0.Add(19*24*time.Hour)).Data

	tests := map[string]struct {
		data    map[string][]byte
		trusted []byte
		now     time.Time
		check   func(t *testing.T, p Plan)
	}{
		"empty Secret: a CA and a certificate it signed": {
			now: t0,
			check: func(t *testing.T, p Plan) {
				ca, srv := cert(t, p.Data[KeyCACert]), cert(t, p.Data[KeyCert])
				if !p.Changed || !ca.IsCA || srv.CheckSignatureFrom(ca) != nil || p.WaitingForTrust {
					t.Errorf("changed=%v isCA=%v waiting=%v", p.Changed, ca.IsCA, p.WaitingForTrust)
				}
				if len(srv.DNSNames) != 1 || len(srv.IPAddresses) != 1 {
					t.Errorf("SANs %v %v", srv.DNSNames, srv.IPAddresses)
				}
				if want := certs.RenewAt(srv); !p.RecheckAt.Equal(want) {
					t.Errorf("recheck at %s, want the serving renewal %s", p.RecheckAt, want)
				}
			},
		},
		"valid and trusted: unchanged": {
			data: steady, trusted: steady[KeyCABundle], now: t0.Add(24 * time.Hour),
			check: func(t *testing.T, p Plan) {
				if p.Changed {
					t.Error("changed")
				}
			},
		},
		"serving certificate past two thirds: reissued by the same CA": {
			data: steady, trusted: steady[KeyCABundle], now: t0.Add(7 * 24 * time.Hour),
			check: func(t *testing.T, p Plan) {
				if !p.Changed || string(p.Data[KeyCACert]) != string(steady[KeyCACert]) || string(p.Data[KeyCert]) == string(steady[KeyCert]) {
					t.Error("want a new serving certificate and the same CA")
				}
			},
		},
		"CA past two thirds, not trusted yet: new CA in the bundle, serving certificate kept": {
			data: renewed, trusted: renewed[KeyCABundle], now: t0.Add(21 * 24 * time.Hour),
			check: func(t *testing.T, p Plan) {
				if string(p.Data[KeyCACert]) == string(renewed[KeyCACert]) {
					t.Fatal("CA not replaced")
				}
				if b := bundle(t, p.Data); len(b) != 2 || !b[1].Equal(cert(t, renewed[KeyCACert])) {
					t.Errorf("bundle has %d CAs, want the new one then the old one", len(b))
				}
				if string(p.Data[KeyCert]) != string(renewed[KeyCert]) || !p.WaitingForTrust {
					t.Errorf("serving certificate replaced before the new CA is trusted (waiting=%v)", p.WaitingForTrust)
				}
			},
		},
		"expired serving certificate, CA not trusted yet: reissued at once": {
			data: steady, trusted: nil, now: t0.Add(10 * 24 * time.Hour),
			check: func(t *testing.T, p Plan) {
				if string(p.Data[KeyCert]) == string(steady[KeyCert]) || p.WaitingForTrust {
					t.Error("an expired certificate must be replaced whatever the trust")
				}
			},
		},
		"DNS names changed: reissued": {
			data: func() map[string][]byte {
				p, err := Next(nil, nil, Settings{CAValidity: settings.CAValidity, CertValidity: settings.CertValidity, DNSNames: []string{"old.example"}, CACommonName: "x"}, t0)
				if err != nil {
					t.Fatal(err)
				}
				return p.Data
			}(),
			now:     t0.Add(time.Hour),
			trusted: nil, // a usable certificate for other names is replaced without waiting for trust
			check: func(t *testing.T, p Plan) {
				if !p.Changed || len(cert(t, p.Data[KeyCert]).DNSNames) != 1 || cert(t, p.Data[KeyCert]).DNSNames[0] != "svc.ns.svc" {
					t.Error("want a certificate for the new names")
				}
			},
		},
		"key does not match the certificate: reissued": {
			data: func() map[string][]byte {
				d := maps.Clone(steady)
				d[KeyKey] = steady[KeyCAKey]
				return d
			}(),
			trusted: steady[KeyCABundle], now: t0.Add(time.Hour),
			check: func(t *testing.T, p Plan) {
				if string(p.Data[KeyKey]) == string(steady[KeyCAKey]) {
					t.Error("broken pair kept")
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { tc.check(t, step(t, tc.data, tc.trusted, tc.now)) })
	}
}

// A whole CA rotation, step by step as the rotator runs it: at no point is
// the served certificate signed by a CA the webhook configuration does not
// trust, and the old CA leaves the bundle once it expires.
func TestNextCARotation(t *testing.T) {
	p := step(t, nil, nil, t0)
	trusted := p.Data[KeyCABundle] // the rotator sets the caBundle
	p = step(t, p.Data, trusted, t0.Add(19*24*time.Hour))
	servedTrusted := func(data map[string][]byte, trusted []byte) bool {
		srv := cert(t, data[KeyCert])
		cas, _ := certs.ParseCerts(trusted)
		for _, ca := range cas {
			if srv.CheckSignatureFrom(ca) == nil {
				return true
			}
		}
		return false
	}
	oldCA := cert(t, p.Data[KeyCACert])
	now := t0.Add(21 * 24 * time.Hour) // CA due
	p = step(t, p.Data, trusted, now)
	if !servedTrusted(p.Data, trusted) || !p.WaitingForTrust {
		t.Fatal("first step must keep a trusted certificate and wait")
	}
	trusted = p.Data[KeyCABundle]
	p = step(t, p.Data, trusted, now)
	newCA := cert(t, p.Data[KeyCACert])
	if newCA.Equal(oldCA) || cert(t, p.Data[KeyCert]).CheckSignatureFrom(newCA) != nil || !servedTrusted(p.Data, trusted) {
		t.Fatal("second step must reissue by the new, trusted CA")
	}
	if len(bundle(t, p.Data)) != 2 {
		t.Fatal("the old CA must stay trusted until it expires")
	}
	p = step(t, p.Data, trusted, oldCA.NotAfter.Add(time.Minute))
	if b := bundle(t, p.Data); len(b) != 1 || !b[0].Equal(newCA) {
		t.Fatalf("after the old CA expired the bundle has %d CAs", len(b))
	}
}
