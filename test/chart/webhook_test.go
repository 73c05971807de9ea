package chart_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// install renders the chart for rel, serving only namespaces labelled
// e2e=<release name>, creates its namespace and its RBAC objects for real,
// and returns the rendered objects.
func install(t *testing.T, rel chart.Release, vals string) []*unstructured.Unstructured {
	t.Helper()
	v := values(t, vals)
	webhookVals, _ := v["webhook"].(map[string]any)
	if webhookVals == nil {
		webhookVals = map[string]any{}
		v["webhook"] = webhookVals
	}
	webhookVals["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{"e2e": rel.Name}}
	objs, _, err := chart.Render(rel, v)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rel.Namespace}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := k8s.Create(t.Context(), o.DeepCopy()); err != nil {
				t.Fatalf("creating %s: %v", chart.Key(o), err)
			}
		}
	}
	return objs
}

// createWebhookConfiguration creates the chart's webhook configuration with
// its clientConfig pointed at a local port instead of the Service, as the
// API server cannot reach a Service here. With caBundle nil, the caBundle is
// left to the webhook or to cert-manager's CA injector, as in a cluster.
func createWebhookConfiguration(t *testing.T, objs []*unstructured.Unstructured, name string, port int, caBundle []byte) {
	t.Helper()
	mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", name))
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig.Service = nil
		mwc.Webhooks[i].ClientConfig.URL = ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", port, admission.Path))
		mwc.Webhooks[i].ClientConfig.CABundle = caBundle
	}
	if err := k8s.Create(t.Context(), mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), mwc) })
}

// replica is one running webhook process.
type replica struct {
	addr, readyURL string
}

// startWebhook runs the webhook with the chart's args, as the chart's
// ServiceAccount (impersonated, so only the chart's RBAC applies), listening
// on 127.0.0.1:port. adjust changes the options for the local run.
func startWebhook(t *testing.T, objs []*unstructured.Unstructured, port int, adjust func(*webhook.Options)) replica {
	t.Helper()
	dep := convert[appsv1.Deployment](t, onlyOfKind(t, objs, "Deployment"))
	o := parseArgs(t, containerArgs(t, objs))
	o.Host = "127.0.0.1"
	o.Port = port
	o.MetricsBindAddress = "0"
	o.HealthProbeBindAddress = freeAddr(t)
	o.ShutdownTimeout = 5 * time.Second
	if adjust != nil {
		adjust(&o)
	}
	cfg := rest.CopyConfig(env.Config)
	sa := "system:serviceaccount:" + dep.Namespace + ":" + dep.Spec.Template.Spec.ServiceAccountName
	cfg.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + dep.Namespace, "system:authenticated"}}
	log, err := logging.New("error")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- webhook.Run(ctx, o, cfg, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook stopped with %v", err)
		}
	})
	return replica{addr: net.JoinHostPort(o.Host, strconv.Itoa(port)), readyURL: "http://" + o.HealthProbeBindAddress + "/readyz"}
}

// onlyOfKind returns the one object of kind.
func onlyOfKind(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s rendered, want 1", len(found), kind)
	}
	return found[0]
}

func waitReady(t *testing.T, r replica) {
	t.Helper()
	poll(t, "webhook ready at "+r.readyURL, func(ctx context.Context) (bool, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.readyURL, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status + " " + string(body)
	})
}

// served returns the certificate r presents, verified against the CAs in
// bundle.
func served(r replica, bundle []byte) (*x509.Certificate, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, fmt.Errorf("no CA in the bundle")
	}
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", r.addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func freePort(t *testing.T) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(freeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}

// servedNamespace creates a namespace the release's webhook serves.
func servedNamespace(t *testing.T, rel chart.Release) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "addon-", Labels: map[string]string{"e2e": rel.Name}}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// createInjected creates an annotated Deployment and checks that the API
// server had the webhook inject the reporter.
func createInjected(ctx context.Context, ns, name string) error {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"addon-heartbeat.io/inject": "true"}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example.com/addon:v1"}}},
			},
		},
	}
	if err := k8s.Create(ctx, d); err != nil {
		return fmt.Errorf("creating Deployment %s/%s: %w", ns, name, err)
	}
	for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
		if c.Name == inject.ContainerName {
			return nil
		}
	}
	return fmt.Errorf("deployment %s/%s was admitted without the reporter: %v", ns, name, strings.Join(containerNames(d), ","))
}

func containerNames(d *appsv1.Deployment) []string {
	var out []string
	for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
		out = append(out, c.Name)
	}
	return out
}

// awaitRenewal waits until replica r serves a certificate of the CA in
// bundle (the mounted Secret, renewed, reloaded without a restart) and the
// API server admits an opted-in Deployment in ns through it.
func awaitRenewal(t *testing.T, r replica, ns string, bundle []byte) {
	t.Helper()
	poll(t, "the webhook serving the renewed certificate without a restart", func(context.Context) (bool, string) {
		_, err := served(r, bundle)
		return err == nil, fmt.Sprint(err)
	})
	poll(t, "admission with the renewed certificate", func(ctx context.Context) (bool, string) {
		// The API server may still hold a connection from before; a new
		// Deployment name per attempt.
		err := createInjected(ctx, ns, fmt.Sprintf("second-%d", time.Now().UnixNano()))
		return err == nil, fmt.Sprint(err)
	})
}
