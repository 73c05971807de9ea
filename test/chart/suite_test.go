// Package chart_test checks the Helm chart and config/ against a real
// kube-apiserver: what they render is accepted by the API server, helm lint
// is clean, invalid values are refused, config/ stays equivalent to the
// chart, and the chart's cert-manager mode works with cert-manager's own CA
// injector.
package chart_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

const (
	certManagerModule  = "github.com/cert-manager/cert-manager"
	certManagerVersion = "v1.21.2"
	// The Prometheus Operator's CRDs (ServiceMonitor, PodMonitor,
	// PrometheusRule), from its module.
	prometheusOperatorModule  = "github.com/prometheus-operator/prometheus-operator"
	prometheusOperatorVersion = "v0.85.0"
	testTimeout               = 60 * time.Second
)

// One kube-apiserver + etcd for the package, with the AddonInstance,
// cert-manager and Prometheus Operator CRDs installed, and the release
// namespace created.
var (
	env *testenv.Environment
	k8s client.Client
)

func TestMain(m *testing.M) {
	cm, err := testenv.ModuleDir(certManagerModule, certManagerVersion)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	po, err := testenv.ModuleDir(prometheusOperatorModule, prometheusOperatorVersion)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	crds := filepath.Join(po, "example", "prometheus-operator-crd")
	opts := testenv.Options{CRDPaths: []string{
		filepath.Join(cm, "deploy", "crds"),
		filepath.Join(crds, "monitoring.coreos.com_servicemonitors.yaml"),
		filepath.Join(crds, "monitoring.coreos.com_podmonitors.yaml"),
		filepath.Join(crds, "monitoring.coreos.com_prometheusrules.yaml"),
	}}
	os.Exit(testenv.RunSuite(m, logging.LevelError, opts, func(s *testenv.Suite) (func() error, error) {
		env, k8s = s.Env, s.Client
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chart.DefaultRelease.Namespace}}
		return nil, k8s.Create(context.Background(), ns)
	}))
}

// values parses chart values written as YAML.
func values(t *testing.T, y string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(y), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// render renders the chart for the default release.
func render(t *testing.T, vals string) ([]*unstructured.Unstructured, string) {
	t.Helper()
	return renderFor(t, chart.Cluster{}, vals)
}

// renderFor renders the chart for the default release on cluster.
func renderFor(t *testing.T, cluster chart.Cluster, vals string) ([]*unstructured.Unstructured, string) {
	t.Helper()
	objs, notes, err := chart.RenderFor(chart.DefaultRelease, cluster, values(t, vals))
	if err != nil {
		t.Fatal(err)
	}
	return objs, notes
}

func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := chart.Find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	return o
}

// convert turns an unstructured object into a typed one.
func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// poll waits for cond, failing the test with what it last saw.
func poll(t *testing.T, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, testTimeout, true, func(ctx context.Context) (bool, error) {
		ok, seen := cond(ctx)
		last = seen
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last: %s)", what, err, last)
	}
}
