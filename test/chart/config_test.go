package chart_test

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// kustomize builds a folder of config/ as `kubectl apply -k` would.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), "config", dir))
	if err != nil {
		t.Fatalf("kustomize build config/%s: %v", dir, err)
	}
	y, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := chart.Decode(y)
	if err != nil {
		t.Fatal(err)
	}
	chart.Sort(objs)
	return objs
}

// withoutLabels drops the objects' own labels, which say who installed them
// (Helm or kustomize); everything else must be the same.
func withoutLabels(objs []*unstructured.Unstructured) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, o := range objs {
		o = o.DeepCopy()
		o.SetLabels(nil)
		out[chart.Key(o)] = o.Object
	}
	return out
}

// config/ holds the same objects as the chart renders on Kubernetes 1.30+
// (which serves ValidatingAdmissionPolicy, for the fencing policy) with its
// default values (config/default), in cert-manager mode (config/cert-manager) and on
// OpenShift with the service CA (config/openshift), apart from labels and the
// Namespace that only kustomize creates.
func TestConfigEquivalentToChart(t *testing.T) {
	tests := map[string]struct {
		dir, values string
		cluster     chart.Cluster
	}{
		"self-managed certificates": {dir: "default"},
		"cert-manager":              {dir: "cert-manager", values: `certificates: {mode: certManager}`},
		"OpenShift, service CA":     {dir: "openshift", values: `{platform: openshift, certificates: {mode: openshiftServiceCA}}`},
		// What an OpenShift user gets from helm install with the platform found.
		"OpenShift found by auto, service CA": {dir: "openshift", values: `certificates: {mode: openshiftServiceCA}`, cluster: chart.OpenShift},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// As helm install finds a 1.30+ API server: with the fencing policy.
			objs, _ := renderFor(t, tc.cluster.With(chart.AdmissionPolicyAPIVersions...), tc.values)
			var built []*unstructured.Unstructured
			for _, o := range kustomize(t, tc.dir) {
				if o.GetKind() != "Namespace" {
					built = append(built, o)
				}
			}
			if diff := cmp.Diff(withoutLabels(objs), withoutLabels(built)); diff != "" {
				t.Errorf("config/%s differs from the chart (-chart +config):\n%s", tc.dir, diff)
			}
		})
	}
}

// config/webhook/manifests.yaml, which the webhook's own envtest suite
// installs, is the chart's webhook configuration.
func TestWebhookManifestIsTheChart(t *testing.T) {
	objs, _ := render(t, "")
	want := mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat")
	got, err := chart.DecodeFile(filepath.Join(testenv.RepoRoot(), "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d objects in config/webhook/manifests.yaml", len(got))
	}
	if diff := cmp.Diff(withoutLabels(objs)[chart.Key(want)], withoutLabels(got)[chart.Key(got[0])]); diff != "" {
		t.Errorf("config/webhook/manifests.yaml differs from the chart (-chart +manifest):\n%s", diff)
	}
}
