package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// One real kube-apiserver + etcd for the package, with the webhook
// configuration from config/ installed (envtest points its clientConfig at
// the local server and sets its caBundle), and the webhook running in-process
// over TLS.
var (
	env         *testenv.Environment
	k8s         client.Client
	clientset   *kubernetes.Clientset
	options     Options
	metricsURL  string
	readyURL    string
	webhookURL  string
	webhookTLS  *tls.Config
	injectCfg   inject.Config
	testTimeout = 30 * time.Second
)

const reporterImage = "registry.example.com/addon-heartbeat/reporter:v0.1.0-test"

func TestMain(m *testing.M) {
	opts := testenv.Options{
		WebhookPaths: []string{filepath.Join(testenv.RepoRoot(), "config", "webhook", "manifests.yaml")},
	}
	os.Exit(testenv.RunSuite(m, logging.LevelInfo, opts, setUp))
}

// setUp starts the webhook in-process on envtest's serving port and
// certificate, and returns its graceful shutdown.
func setUp(s *testenv.Suite) (func() error, error) {
	env, k8s = s.Env, s.Client
	clientset = kubernetes.NewForConfigOrDie(env.Config)

	wio := env.WebhookInstallOptions
	options = DefaultOptions()
	options.Host = wio.LocalServingHost
	options.Port = wio.LocalServingPort
	options.CertDir = wio.LocalServingCertDir
	options.ReporterImage = reporterImage
	options.ReporterAddonInstanceNames = []string{"addon-instance"} // the chart's default
	options.ShutdownTimeout = 5 * time.Second
	// The webhook's own namespace holds its record signing key.
	options.Namespace = "addon-heartbeat-system"
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: options.Namespace}}); err != nil {
		return nil, err
	}
	var err error
	if injectCfg, err = options.InjectConfig(); err != nil {
		return nil, err
	}
	webhookURL = fmt.Sprintf("https://%s%s", net.JoinHostPort(wio.LocalServingHost, fmt.Sprint(wio.LocalServingPort)), admission.Path)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(wio.LocalServingCAData)
	webhookTLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	// The metrics and health ports are picked free but not held, so another
	// test process may take one first: then Run fails at once, and it is
	// started again on new ports.
	var (
		cancel context.CancelFunc
		done   chan error
	)
	for attempt := 1; ; attempt++ {
		options.MetricsBindAddress = freeAddr()
		options.HealthProbeBindAddress = freeAddr()
		metricsURL = "http://" + options.MetricsBindAddress + "/metrics"
		readyURL = "http://" + options.HealthProbeBindAddress + "/readyz"
		ctx, stop := context.WithCancel(context.Background())
		ended, o := make(chan error, 1), options
		go func() { ended <- Run(ctx, o, env.Config, s.Log.WithName("webhook")) }()
		cancel, done = stop, ended
		err := waitReady(readyURL, done)
		if err == nil {
			break
		}
		cancel()
		fmt.Fprintf(os.Stderr, "webhook start %d: %v\n", attempt, err)
		if attempt == 3 {
			return nil, fmt.Errorf("the webhook did not start: %w", err)
		}
	}
	return func() error { return shutDown(cancel, done) }, nil
}

// shutDown stops the webhook gracefully: Run returns nil once its context is
// cancelled.
func shutDown(cancel context.CancelFunc, done <-chan error) error {
	cancel()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("the webhook did not shut down cleanly: %w", err)
		}
		return nil
	case <-time.After(testTimeout):
		return fmt.Errorf("the webhook did not stop within %s", testTimeout)
	}
}

// waitReady waits for the webhook's readiness endpoint, or for Run to end
// first, whose error it returns.
func waitReady(url string, done chan error) error {
	ready := make(chan error, 1)
	go func() { ready <- waitHTTP(url, http.StatusOK) }()
	select {
	case err := <-ready:
		return err
	case err := <-done:
		done <- err
		return fmt.Errorf("the webhook stopped before it was ready: %w", err)
	}
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitHTTP(url string, want int) error {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		resp, err := http.Get(url)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == want, nil
	})
	if err != nil {
		return fmt.Errorf("%s: last %s: %w", url, last, err)
	}
	return nil
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "addon-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// addon is a small addon Deployment with the given annotations.
func addon(ns, name string, annots map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annots},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "manager", Image: "registry.example.com/my-addon:v1.0.0",
					Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}},
				}}},
			},
		},
	}
}

// metrics scrapes the webhook's /metrics endpoint.
type metrics map[string]*dto.MetricFamily

func scrape(t *testing.T) metrics {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// value sums the counter or histogram-count series of name whose labels
// include every pair in match ("k=v").
func (m metrics) value(name string, match ...string) float64 {
	mf, ok := m[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, s := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for _, kv := range match {
			k, v, _ := strings.Cut(kv, "=")
			if labels[k] != v {
				ok = false
			}
		}
		if !ok {
			continue
		}
		switch {
		case s.Counter != nil:
			sum += s.GetCounter().GetValue()
		case s.Histogram != nil:
			sum += float64(s.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

const (
	reviewsTotal  = "addon_heartbeat_webhook_reviews_total"
	requestsTotal = "controller_runtime_webhook_requests_total"
)
