package chart_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/addon-heartbeat/addon-heartbeat/internal/certrotator"
	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// The chart's default mode, end to end: two webhook replicas run with the
// chart's args as the chart's ServiceAccount. The elected one creates the CA
// and serving certificate in the Secret and sets the webhook
// configuration's caBundle; both serve the Secret's certificate and are
// ready only then; the API server calls the webhook with that CA. With short
// lifetimes the serving certificate and then the CA are replaced while
// Deployments keep being admitted, with no restart and no failed admission.
func TestSelfManagedCertificates(t *testing.T) {
	rel := chart.Release{Name: "selfmanaged", Namespace: "selfmanaged-system"}
	objs := install(t, rel, "")
	const mwcName, secretName = "selfmanaged-addon-heartbeat", "selfmanaged-addon-heartbeat-webhook-tls"
	port := freePort(t)
	createWebhookConfiguration(t, objs, mwcName, port, nil)
	shortLived := func(o *webhook.Options) {
		// The API server calls 127.0.0.1; the Service's names are of no use here.
		o.CertDNSNames = []string{"127.0.0.1"}
		// Serving certificate renewed every 8 s, CA replaced after 24 s.
		o.CertValidity = 12 * time.Second
		o.CAValidity = 36 * time.Second
	}
	first := startWebhook(t, objs, port, shortLived)
	second := startWebhook(t, objs, freePort(t), shortLived)
	waitReady(t, first)
	waitReady(t, second)

	secretKey := types.NamespacedName{Namespace: rel.Namespace, Name: secretName}
	var secret corev1.Secret
	if err := k8s.Get(t.Context(), secretKey, &secret); err != nil {
		t.Fatal(err)
	}
	firstCA, err := certs.ParseCert(secret.Data[certrotator.KeyCACert])
	if err != nil {
		t.Fatal(err)
	}
	// The caBundle is the Secret's, set by the webhook.
	poll(t, "caBundle set by the webhook", func(ctx context.Context) (bool, string) {
		var mwc admissionv1.MutatingWebhookConfiguration
		if err := k8s.Get(ctx, types.NamespacedName{Name: mwcName}, &mwc); err != nil {
			return false, err.Error()
		}
		got := mwc.Webhooks[0].ClientConfig.CABundle
		cas, _ := certs.ParseCerts(got)
		return len(cas) > 0 && cas[0].Equal(firstCA), fmt.Sprintf("%d CAs", len(cas))
	})
	// Both replicas serve a certificate of that CA.
	for _, r := range []replica{first, second} {
		poll(t, "replica at "+r.addr+" serving the Secret's certificate", func(context.Context) (bool, string) {
			c, err := served(r, secret.Data[certrotator.KeyCACert])
			if err != nil {
				return false, err.Error()
			}
			return c.CheckSignatureFrom(firstCA) == nil, c.SerialNumber.String()
		})
	}
	ns := servedNamespace(t, rel)
	if err := createInjected(t.Context(), ns, "first"); err != nil {
		t.Fatal(err)
	}

	// Keep admitting Deployments while the certificates rotate.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var admitted atomic.Int64
	errs := make(chan error, 1)
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := createInjected(ctx, ns, fmt.Sprintf("during-rotation-%d", i)); err != nil {
				if ctx.Err() != nil {
					return
				}
				select {
				case errs <- err:
				default:
				}
				return
			}
			admitted.Add(1)
		}
	})
	// Rotation: a new CA, the serving certificate reissued by it, both
	// replicas serving it, the old CA still trusted until it expires.
	var newCA []byte
	poll(t, "CA replaced and the serving certificate reissued by it", func(ctx context.Context) (bool, string) {
		select {
		case err := <-errs:
			t.Fatalf("admission failed during rotation: %v", err)
		default:
		}
		var s corev1.Secret
		if err := k8s.Get(ctx, secretKey, &s); err != nil {
			return false, err.Error()
		}
		ca, err := certs.ParseCert(s.Data[certrotator.KeyCACert])
		if err != nil || ca.Equal(firstCA) {
			return false, "the first CA is still current"
		}
		srv, err := certs.ParseCert(s.Data[certrotator.KeyCert])
		if err != nil || srv.CheckSignatureFrom(ca) != nil {
			return false, "the serving certificate is not yet from the new CA"
		}
		newCA = s.Data[certrotator.KeyCACert]
		return true, ""
	})
	for _, r := range []replica{first, second} {
		poll(t, "replica at "+r.addr+" serving the new CA's certificate without a restart", func(context.Context) (bool, string) {
			c, err := served(r, newCA)
			if err != nil {
				return false, err.Error()
			}
			return true, c.SerialNumber.String()
		})
	}
	// A few more admissions on the new certificate, then stop.
	target := admitted.Load() + 4
	poll(t, "admissions after the rotation", func(context.Context) (bool, string) {
		select {
		case err := <-errs:
			t.Fatalf("admission failed during rotation: %v", err)
		default:
		}
		return admitted.Load() >= target, fmt.Sprint(admitted.Load())
	})
	stop()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("admission failed during rotation: %v", err)
	default:
	}
	var mwc admissionv1.MutatingWebhookConfiguration
	if err := k8s.Get(t.Context(), types.NamespacedName{Name: mwcName}, &mwc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(mwc.Webhooks[0].ClientConfig.CABundle, newCA) {
		t.Error("the caBundle does not hold the new CA")
	}
	t.Logf("%d Deployments admitted through the rotation", admitted.Load())
}
