package chart_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// The chart's cert-manager mode, end to end with cert-manager's own CA
// injector running in-process: it copies the CA of the chart's serving
// Certificate into the webhook configuration (cert-manager.io/inject-ca-from),
// and the API server then calls the webhook, which serves the Secret's
// certificate from its folder. When cert-manager replaces the certificate and
// its CA, admission keeps working without a restart.
//
// cert-manager's controller, which would issue the Certificate, cannot be
// built here (its cmd modules are not served by the module proxy), so the
// test writes the issued Secret itself, as cert-manager does: ca.crt, tls.crt
// and tls.key, annotated with the Certificate's name. Its certificate is for
// 127.0.0.1, where the API server reaches the webhook here, rather than for
// the Service's names that the Certificate lists. The kubelet's Secret volume
// is played by writing the same files into the webhook's --cert-dir.
func TestCertManagerMode(t *testing.T) {
	rel := chart.Release{Name: "certmanager", Namespace: "certmanager-system"}
	objs := install(t, rel, `certificates: {mode: certManager}`)
	const mwcName, certName, secretName = "certmanager-addon-heartbeat", "certmanager-addon-heartbeat-serving", "certmanager-addon-heartbeat-webhook-tls"
	for _, o := range objs {
		if o.GetKind() == "Issuer" || o.GetKind() == "Certificate" {
			if err := k8s.Create(t.Context(), o.DeepCopy()); err != nil {
				t.Fatalf("creating %s: %v", chart.Key(o), err)
			}
		}
	}
	secretKey := types.NamespacedName{Namespace: rel.Namespace, Name: secretName}
	certDir := t.TempDir()
	firstCA := issue(t, secretKey, certName, certDir)

	port := freePort(t)
	createWebhookConfiguration(t, objs, mwcName, port, nil)
	startCAInjector(t)
	waitCABundle(t, mwcName, firstCA)

	r := startWebhook(t, objs, port, func(o *webhook.Options) { o.CertDir = certDir })
	waitReady(t, r)
	ns := servedNamespace(t, rel)
	if err := createInjected(t.Context(), ns, "first"); err != nil {
		t.Fatal(err)
	}

	// cert-manager replaces the CA and the serving certificate.
	secondCA := issue(t, secretKey, certName, certDir)
	waitCABundle(t, mwcName, secondCA)
	awaitRenewal(t, r, ns, secondCA)
}

// issue does what cert-manager does when it issues the serving Certificate:
// a CA and a certificate in the Certificate's Secret; it also writes the files
// that the Secret volume would show. It returns the CA in PEM.
func issue(t *testing.T, key types.NamespacedName, certName, dir string) []byte {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA("certmanager-addon-heartbeat-ca", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": kp.CertPEM, "tls.key": kp.KeyPEM}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Annotations: map[string]string{
			cmapi.CertificateNameKey:       certName,
			cmapi.IssuerNameAnnotationKey:  "certmanager-addon-heartbeat-ca",
			cmapi.IssuerKindAnnotationKey:  "Issuer",
			cmapi.IssuerGroupAnnotationKey: "cert-manager.io",
		}},
		Type: corev1.SecretTypeTLS,
		Data: data,
	}
	var existing corev1.Secret
	switch err := k8s.Get(t.Context(), key, &existing); {
	case err == nil:
		existing.Data = data
		if err := k8s.Update(t.Context(), &existing); err != nil {
			t.Fatal(err)
		}
	case client.IgnoreNotFound(err) == nil:
		if err := k8s.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal(err)
	}
	writeCertFiles(t, dir, data)
	return ca.CertPEM
}

// writeCertFiles writes tls.key and tls.crt from data into dir, as the
// kubelet's Secret volume shows them, each replaced at once.
func writeCertFiles(t *testing.T, dir string, data map[string][]byte) {
	t.Helper()
	// Key first: the webhook pairs the files on every change.
	for _, name := range []string{"tls.key", "tls.crt"} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data[name], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// startCAInjector runs cert-manager's CA injector for webhook configurations,
// as its cainjector binary does.
func startCAInjector(t *testing.T) {
	t.Helper()
	scheme := k8sruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme))
	// The injector applies the caBundle server-side with a field manager named
	// after its user agent, as cainjector sets it.
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = "cert-manager-cainjector/" + certManagerVersion
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// As cainjector: Secrets are read directly, only their metadata cached.
		Client:     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor:        map[string]bool{"mutatingwebhookconfiguration": true},
	}); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("CA injector: %v", err)
		}
	})
}

// waitCABundle waits until the webhook configuration's caBundle holds ca.
// cert-manager's injector merges a new CA into the bundle (CAInjectorMerging)
// and keeps the previous one, as a CA rotation needs.
func waitCABundle(t *testing.T, name string, ca []byte) {
	t.Helper()
	want, err := certs.ParseCert(ca)
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "caBundle injected by cert-manager", func(ctx context.Context) (bool, string) {
		var mwc admissionv1.MutatingWebhookConfiguration
		if err := k8s.Get(ctx, types.NamespacedName{Name: name}, &mwc); err != nil {
			return false, err.Error()
		}
		bundle, err := certs.ParseCerts(mwc.Webhooks[0].ClientConfig.CABundle)
		if err != nil {
			return false, err.Error()
		}
		return slices.ContainsFunc(bundle, want.Equal), fmt.Sprintf("%d CAs", len(bundle))
	})
}
