// Package certexpiry exports the validity of the certificate the webhook
// serves, whichever way it gets it (self-managed from its Secret, or the
// files cert-manager or OpenShift's service CA write): the certificate read
// at each scrape is the one the next TLS handshake would present.
package certexpiry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/addon-heartbeat/addon-heartbeat/internal/promslot"
)

// Metric names.
const (
	MetricNotAfter  = "addon_heartbeat_webhook_serving_certificate_not_after_timestamp_seconds"
	MetricNotBefore = "addon_heartbeat_webhook_serving_certificate_not_before_timestamp_seconds"
)

var (
	descNotAfter = prometheus.NewDesc(MetricNotAfter,
		"Unix time the serving certificate the webhook presents expires (its notAfter); absent while it has none.", nil, nil)
	descNotBefore = prometheus.NewDesc(MetricNotBefore,
		"Unix time the serving certificate the webhook presents became valid (its notBefore); absent while it has none.", nil, nil)
)

// Source returns the certificate the webhook serves now, as a
// tls.Config's GetCertificate does.
type Source func(*tls.ClientHelloInfo) (*tls.Certificate, error)

// Collector exports the notBefore and notAfter of the certificate its Source
// returns at each scrape. One Collector is registered per process; each
// webhook run sets its Source.
type Collector struct {
	promslot.Slot[Source]
}

var _ prometheus.Collector = &Collector{}

// Describe sends the gauges' descriptors.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descNotAfter
	ch <- descNotBefore
}

// Collect sends the gauges; none while there is no certificate.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	src, ok := c.Get()
	if !ok {
		return
	}
	cert, err := src(nil)
	if err != nil || cert == nil {
		return
	}
	leaf, err := Leaf(cert)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descNotAfter, prometheus.GaugeValue, unixSeconds(leaf.NotAfter))
	ch <- prometheus.MustNewConstMetric(descNotBefore, prometheus.GaugeValue, unixSeconds(leaf.NotBefore))
}

// Leaf is cert's parsed leaf certificate (tls.X509KeyPair fills it in; a
// certificate built otherwise is parsed).
func Leaf(cert *tls.Certificate) (*x509.Certificate, error) {
	if cert.Leaf != nil {
		return cert.Leaf, nil
	}
	if len(cert.Certificate) == 0 {
		return nil, errNoCertificate
	}
	return x509.ParseCertificate(cert.Certificate[0])
}

var errNoCertificate = errors.New("the TLS certificate holds no certificate")

func unixSeconds(t time.Time) float64 { return float64(t.Unix()) }
