package certexpiry

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

func TestCollector(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ca, err := certs.NewCA("test-ca", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"127.0.0.1"}, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	served, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := certs.ParseCert(kp.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	exposition := fmt.Sprintf(`
# HELP %[1]s Unix time the serving certificate the webhook presents expires (its notAfter); absent while it has none.
# TYPE %[1]s gauge
%[1]s %[2]d
# HELP %[3]s Unix time the serving certificate the webhook presents became valid (its notBefore); absent while it has none.
# TYPE %[3]s gauge
%[3]s %[4]d
`, MetricNotAfter, leaf.NotAfter.Unix(), MetricNotBefore, leaf.NotBefore.Unix())
	withoutLeaf := served
	withoutLeaf.Leaf = nil

	tests := map[string]struct {
		src  Source
		want string // the exposition, empty for none
	}{
		"a served certificate": {
			src:  func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &served, nil },
			want: exposition,
		},
		"a certificate without its parsed leaf": {
			src:  func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &withoutLeaf, nil },
			want: exposition,
		},
		"none loaded yet": {
			src: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return nil, errors.New("no serving certificate loaded yet")
			},
		},
		"an empty certificate": {
			src: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var c Collector
			release := c.Set(tc.src)
			defer release()
			if tc.want == "" {
				if n := testutil.CollectAndCount(&c); n != 0 {
					t.Errorf("%d series, want none", n)
				}
				return
			}
			if err := testutil.CollectAndCompare(&c, strings.NewReader(tc.want)); err != nil {
				t.Error(err)
			}
		})
	}
	// 24 hours apart, as issued (notBefore is backdated for clock skew).
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d < 24*time.Hour {
		t.Errorf("lifetime %s", d)
	}
}
