package chart_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// The service CA operator's annotations (openshift/service-ca-operator,
// pkg/controller/api).
const (
	servingCertSecretAnnotation = "service.beta.openshift.io/serving-cert-secret-name"
	injectCABundleAnnotation    = "service.beta.openshift.io/inject-cabundle"
	originatingServiceName      = "service.beta.openshift.io/originating-service-name"
	originatingServiceUID       = "service.beta.openshift.io/originating-service-uid"
)

// The chart on OpenShift with certificates from the service CA
// (platform=openshift, certificates.mode=openshiftServiceCA), end to end as
// far as an API server without OpenShift goes. The test does what the service
// CA operator does, led only by the chart's annotations: its serving-cert
// signer issues a certificate into the Secret that the Service's
// serving-cert-secret-name names (tls.crt and tls.key, owned by the Service),
// and its cabundle injector sets the caBundle of every webhook of the
// configuration annotated inject-cabundle. The webhook runs with the chart's
// args as the chart's ServiceAccount (which may read no Secret), serving that
// Secret from its folder (the kubelet's Secret volume played by writing the
// same files); the API server calls it, and the reporter it injects has
// OpenShift's security context. When the service CA's certificate and CA are
// replaced, admission continues without a restart.
func TestOpenShiftServiceCAMode(t *testing.T) {
	rel := chart.Release{Name: "serviceca", Namespace: "serviceca-system"}
	objs := install(t, rel, `{platform: openshift, certificates: {mode: openshiftServiceCA}}`)
	const mwcName = "serviceca-addon-heartbeat"
	svc := convert[corev1.Service](t, mustFind(t, objs, "Service", "serviceca-addon-heartbeat-webhook"))
	if err := k8s.Create(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
	secretName := svc.Annotations[servingCertSecretAnnotation]
	dep := convert[appsv1.Deployment](t, onlyOfKind(t, objs, "Deployment"))
	if !slices.ContainsFunc(dep.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == secretName && secretName != ""
	}) {
		t.Fatalf("the webhook mounts no Secret %q, the Service's %s", secretName, servingCertSecretAnnotation)
	}

	certDir := t.TempDir()
	firstCA := serviceCAIssue(t, svc, certDir)
	port := freePort(t)
	createWebhookConfiguration(t, objs, mwcName, port, nil)
	serviceCAInjectBundle(t, mwcName, firstCA)

	r := startWebhook(t, objs, port, func(o *webhook.Options) { o.CertDir = certDir })
	waitReady(t, r)
	ns := servedNamespace(t, rel)
	d, err := createOptedIn(t.Context(), ns, "first")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range slices.Concat(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers) {
		if c.Name != inject.ContainerName {
			continue
		}
		if sc := c.SecurityContext; sc == nil || sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.SeccompProfile != nil {
			t.Errorf("the reporter's security context on OpenShift %+v, want the UID, GID and seccomp profile left to the SCC", sc)
		}
	}

	// The service CA renews the certificate, here from a new CA.
	secondCA := serviceCAIssue(t, svc, certDir)
	serviceCAInjectBundle(t, mwcName, secondCA)
	awaitRenewal(t, r, ns, secondCA)
}

// serviceCAIssue does what the service CA's serving-cert signer does for a
// Service annotated serving-cert-secret-name: a certificate in that Secret,
// owned by the Service and annotated with its name and UID. The certificate
// is for 127.0.0.1, where the API server reaches the webhook here, rather
// than for the Service's names. It also writes the files the Secret volume
// would show, and returns the CA in PEM.
func serviceCAIssue(t *testing.T, svc *corev1.Service, dir string) []byte {
	t.Helper()
	name := svc.Annotations[servingCertSecretAnnotation]
	if name == "" {
		t.Fatalf("Service %s has no %s: the service CA issues nothing", svc.Name, servingCertSecretAnnotation)
	}
	now := time.Now()
	ca, err := certs.NewCA(fmt.Sprintf("openshift-service-serving-signer@%d", now.Unix()), now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{corev1.TLSCertKey: kp.CertPEM, corev1.TLSPrivateKeyKey: kp.KeyPEM}
	key := types.NamespacedName{Namespace: svc.Namespace, Name: name}
	var existing corev1.Secret
	switch err := k8s.Get(t.Context(), key, &existing); {
	case err == nil:
		existing.Data = data
		if err := k8s.Update(t.Context(), &existing); err != nil {
			t.Fatal(err)
		}
	case client.IgnoreNotFound(err) == nil:
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace:       key.Namespace,
				Name:            key.Name,
				Annotations:     map[string]string{originatingServiceName: svc.Name, originatingServiceUID: string(svc.UID)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID}},
			},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}
		if err := k8s.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal(err)
	}
	writeCertFiles(t, dir, data)
	return ca.CertPEM
}

// serviceCAInjectBundle does what the service CA's cabundle injector does for
// a MutatingWebhookConfiguration annotated inject-cabundle=true: it sets the
// caBundle of every webhook to the service CA's bundle.
func serviceCAInjectBundle(t *testing.T, name string, bundle []byte) {
	t.Helper()
	var mwc admissionv1.MutatingWebhookConfiguration
	if err := k8s.Get(t.Context(), types.NamespacedName{Name: name}, &mwc); err != nil {
		t.Fatal(err)
	}
	if mwc.Annotations[injectCABundleAnnotation] != "true" {
		t.Fatalf("MutatingWebhookConfiguration %s is not annotated %s=true: the service CA injects no caBundle", name, injectCABundleAnnotation)
	}
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if err := k8s.Update(t.Context(), &mwc); err != nil {
		t.Fatal(err)
	}
}

// createOptedIn creates an annotated Deployment and returns it as the API
// server stored it, failing if the webhook did not inject the reporter.
func createOptedIn(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
	if err := createInjected(ctx, ns, name); err != nil {
		return nil, err
	}
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}
