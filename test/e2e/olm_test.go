package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// olmHashLabel is where OLM keeps the hash of the Deployment it built from
// the CSV; it compares that label with a hash recomputed from the CSV, never
// with the live spec.
const olmHashLabel = "olm.deployment-spec-hash"

// csvManifest is an addon's ClusterServiceVersion as an operator bundle ships
// it: one Deployment, OwnNamespace install mode, no RBAC (permissions are
// created by the catalog operator's InstallPlan, which is not run here; the
// reporter's own RBAC comes from the webhook). The test adds the opt-in.
const csvManifest = `
apiVersion: operators.coreos.com/v1alpha1
kind: ClusterServiceVersion
metadata:
  name: my-addon.v1.0.0
spec:
  displayName: My addon
  version: 1.0.0
  installModes:
  - {type: OwnNamespace, supported: true}
  - {type: SingleNamespace, supported: true}
  - {type: MultiNamespace, supported: false}
  - {type: AllNamespaces, supported: false}
  install:
    strategy: deployment
    spec:
      deployments:
      - name: my-addon-operator
        label:
          app.kubernetes.io/name: my-addon-operator
        spec:
          replicas: 1
          selector:
            matchLabels: {app.kubernetes.io/name: my-addon-operator}
          template:
            metadata:
              labels: {app.kubernetes.io/name: my-addon-operator}
              annotations: {example.com/owner: addons-team}
            spec:
              serviceAccountName: my-addon-operator
              containers:
              - name: manager
                image: registry.example.com/my-addon-operator:v1.0.0
                args: [--leader-elect]
`

// TestOLM has the real OLM operator install an addon from a CSV whose
// Deployment opts in the only ways a CSV can: a Deployment label (the
// install strategy's label field) or a CSV annotation, which OLM copies onto
// the pod template. OLM's Deployment is injected, reports heartbeats and
// lets the CSV succeed; OLM's replace of the Deployment with a freshly built
// object (its reaction to a hash label that does not match) changes nothing
// and does not loop.
func TestOLM(t *testing.T) {
	start := time.Now()
	dir, err := localcluster.EnsureOLM(os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("OLM %s ready to run in %s (%s)", localcluster.OLMVersion, time.Since(start).Round(time.Millisecond), dir)
	start = time.Now()
	olm, err := cluster.StartOLM(t.Context(), localcluster.OLMOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("OLM started and reconciling in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := olm.Stop(30 * time.Second); err != nil {
			t.Errorf("stopping OLM: %v", err)
		}
		if t.Failed() {
			logTail(t, olm.Name, olm.LogPath, 30)
		}
	})

	tests := map[string]struct {
		// labels are the install strategy's Deployment labels to add,
		// csvAnnotations the CSV's metadata annotations.
		labels, csvAnnotations map[string]string
	}{
		"opt-in by the install strategy's Deployment label": {
			labels: map[string]string{annotations.Inject: "true"},
		},
		"opt-in by a CSV annotation, copied onto the pod template": {
			csvAnnotations: map[string]string{annotations.Inject: "true"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t, "olm-addon")
			period := 2 * time.Second
			createAddonInstance(t, ns, "addon-instance", period)
			rec := recordHeartbeats(t, ns, "addon-instance")
			createOperatorGroup(t, ns)
			csv := newCSV(t, ns, tc.labels, tc.csvAnnotations)
			created := time.Now()
			if err := cluster.Client.Create(t.Context(), csv); err != nil {
				t.Fatal(err)
			}

			d := waitDeployment(t, ns, "my-addon-operator", 90*time.Second)
			t.Logf("OLM created the Deployment %s after the CSV", time.Since(created).Round(time.Millisecond))
			checkOLMDeployment(t, d, csv, tc.labels, tc.csvAnnotations)

			// No kubelet or controller-manager: the Deployment becomes
			// available when the test says so, and OLM then lets the CSV
			// succeed.
			setAvailable(t, d, 1)
			available := time.Now()
			waitCSVPhase(t, csv, "Succeeded", 90*time.Second)
			t.Logf("CSV Succeeded %s after the Deployment was set available, %s after the CSV was created",
				time.Since(available).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
			startReporters(t, d, 1)
			rec.waitCondition(t, installed, metav1.ConditionTrue, 30*time.Second)
			rec.waitWrites(t, 2, 10*period)

			checkOLMReplace(t, d)
			waitCSVPhase(t, csv, "Succeeded", 90*time.Second)
			rec.waitWrites(t, 2, 10*period)
		})
	}
}

func createOperatorGroup(t *testing.T, ns string) {
	t.Helper()
	og := &unstructured.Unstructured{}
	og.SetGroupVersionKind(localcluster.OperatorGroupGVK)
	og.SetNamespace(ns)
	og.SetName("my-addon")
	if err := unstructured.SetNestedStringSlice(og.Object, []string{ns}, "spec", "targetNamespaces"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Create(t.Context(), og); err != nil {
		t.Fatal(err)
	}
}

// newCSV is csvManifest in ns with labels added to its Deployment's and
// annotations to its own.
func newCSV(t *testing.T, ns string, labels, annots map[string]string) *unstructured.Unstructured {
	t.Helper()
	csv := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(csvManifest), &csv.Object); err != nil {
		t.Fatal(err)
	}
	csv.SetNamespace(ns)
	csv.SetAnnotations(annots)
	deps, _, err := unstructured.NestedSlice(csv.Object, "spec", "install", "spec", "deployments")
	if err != nil || len(deps) != 1 {
		t.Fatalf("csvManifest: %d deployments, %v", len(deps), err)
	}
	dep := deps[0].(map[string]any)
	l, _, _ := unstructured.NestedStringMap(dep, "label")
	maps.Copy(l, labels)
	if err := unstructured.SetNestedStringMap(dep, l, "label"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(csv.Object, deps, "spec", "install", "spec", "deployments"); err != nil {
		t.Fatal(err)
	}
	return csv
}

// waitDeployment waits for OLM to create Deployment ns/name.
func waitDeployment(t *testing.T, ns, name string, timeout time.Duration) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		return cluster.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d) == nil, nil
	})
	if err != nil {
		t.Fatalf("OLM created no Deployment %s/%s within %s", ns, name, timeout)
	}
	return d
}

// waitCSVPhase waits for the CSV to reach phase, reporting the last phase,
// reason and message seen.
func waitCSVPhase(t *testing.T, csv *unstructured.Unstructured, phase string, timeout time.Duration) {
	t.Helper()
	last := "no status"
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(localcluster.ClusterServiceVersionGVK)
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(csv), cur); err != nil {
			if ctx.Err() == nil {
				last = err.Error()
			}
			return false, nil
		}
		p, _, _ := unstructured.NestedString(cur.Object, "status", "phase")
		reason, _, _ := unstructured.NestedString(cur.Object, "status", "reason")
		msg, _, _ := unstructured.NestedString(cur.Object, "status", "message")
		last = fmt.Sprintf("%s (%s: %s)", p, reason, msg)
		return p == phase, nil
	})
	if err != nil {
		t.Fatalf("CSV %s never reached phase %s within %s: last %s", csv.GetName(), phase, timeout, last)
	}
}

// checkOLMDeployment checks that the Deployment OLM built was injected and
// keeps what OLM set: its labels and pod-template annotations.
func checkOLMDeployment(t *testing.T, d *appsv1.Deployment, csv *unstructured.Unstructured, labels, csvAnnots map[string]string) {
	t.Helper()
	// The opt-in did not come from a Deployment annotation: OLM sets none.
	if v, ok := d.Annotations[annotations.Inject]; ok {
		t.Errorf("the Deployment has annotation %s=%q; OLM cannot set Deployment annotations", annotations.Inject, v)
	}
	spec := d.Spec.Template.Spec
	i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.ContainerName })
	if i < 0 {
		t.Fatalf("not injected: no %s init container; labels %v, pod-template annotations %v (is the webhook called for this opt-in? see the matchConditions of %s)",
			inject.ContainerName, d.Labels, d.Spec.Template.Annotations, webhook.Configuration)
	}
	if rp := spec.InitContainers[i].RestartPolicy; rp == nil || *rp != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s is not a native sidecar: restartPolicy %v", inject.ContainerName, rp)
	}
	manager := spec.Containers[slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "manager" })]
	for _, env := range []string{inject.TargetNamespaceEnv, "OPERATOR_CONDITION_NAME"} {
		if !slices.ContainsFunc(manager.Env, func(e corev1.EnvVar) bool { return e.Name == env }) {
			t.Errorf("the addon container has no %s: %+v", env, manager.Env)
		}
	}
	if d.Annotations[annotations.Status] == "" {
		t.Errorf("no %s annotation: %v", annotations.Status, d.Annotations)
	}

	wantLabels := map[string]string{
		"app.kubernetes.io/name": "my-addon-operator",
		"olm.managed":            "true",
		"olm.owner":              csv.GetName(),
		"olm.owner.kind":         "ClusterServiceVersion",
		"olm.owner.namespace":    d.Namespace,
	}
	maps.Copy(wantLabels, labels)
	for k, v := range wantLabels {
		if d.Labels[k] != v {
			t.Errorf("label %s is %q, want %q (labels %v)", k, d.Labels[k], v, d.Labels)
		}
	}
	if d.Labels[olmHashLabel] == "" {
		t.Errorf("no %s label: %v", olmHashLabel, d.Labels)
	}
	wantTemplate := map[string]string{
		"example.com/owner":     "addons-team",
		"olm.operatorGroup":     "my-addon",
		"olm.operatorNamespace": d.Namespace,
		"olm.targetNamespaces":  d.Namespace,
	}
	maps.Copy(wantTemplate, csvAnnots)
	for k, v := range wantTemplate {
		if d.Spec.Template.Annotations[k] != v {
			t.Errorf("pod-template annotation %s is %q, want %q (%v)", k, d.Spec.Template.Annotations[k], v, d.Spec.Template.Annotations)
		}
	}
}

// checkOLMReplace makes OLM replace the Deployment with a freshly built one,
// as it does after a CSV change or when the hash label differs from its own
// (here: the label is changed), and checks that nothing changed: the hash is
// restored, the pod template and generation are as before (no rollout), the
// status annotation is back, and the writes stop.
func checkOLMReplace(t *testing.T, d *appsv1.Deployment) {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	wc, err := client.NewWithWatch(cluster.Config, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &appsv1.DeploymentList{}, client.InNamespace(d.Namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", d.Name)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// A watch without a resourceVersion starts with the current object.
	before := nextDeployment(t, w, 30*time.Second)
	hash := before.Labels[olmHashLabel]
	injectedBefore := webhookReviews(t, "injected")

	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"changed-by-the-test"}}}`, olmHashLabel)
	if err := cluster.Client.Patch(ctx, before.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}

	// Every write from here on, until OLM has put its hash back and the
	// Deployment has then had no write for quiet: a looping OLM (or webhook)
	// never gets there.
	const quiet = 5 * time.Second
	writes, rollouts, last := 0, 0, before
	restored := false
watching:
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended after %d writes", writes)
			}
			cur, isDeployment := ev.Object.(*appsv1.Deployment)
			if !isDeployment || ev.Type != watch.Modified {
				t.Fatalf("unexpected watch event %s %T", ev.Type, ev.Object)
			}
			writes++
			if cur.Generation != last.Generation {
				rollouts++
			}
			t.Logf("write %d: resourceVersion %s, generation %d, %s=%s, status annotation %t", writes, cur.ResourceVersion,
				cur.Generation, olmHashLabel, cur.Labels[olmHashLabel], cur.Annotations[annotations.Status] != "")
			last = cur
			restored = cur.Labels[olmHashLabel] == hash
		case <-time.After(quiet):
			if restored {
				break watching
			}
		case <-ctx.Done():
			t.Fatalf("after %d writes, OLM did not restore its hash %s with no further write for %s: last %s=%s",
				writes, hash, quiet, olmHashLabel, last.Labels[olmHashLabel])
		}
	}
	t.Logf("OLM's replace: %d writes (the test's label change included), %d generation changes, then none for %s", writes, rollouts, quiet)
	// OLM's object came without the sidecar, so the webhook injected it
	// again (the test's label change is "unchanged").
	if n := webhookReviews(t, "injected") - injectedBefore; n < 1 {
		t.Errorf("the webhook injected nothing during OLM's replace (%v reviews): OLM did not send a freshly built Deployment", n)
	}
	if rollouts > 1 {
		t.Errorf("%d rollouts (generation changes) during OLM's replace, want at most one", rollouts)
	}
	if last.Generation != before.Generation {
		t.Errorf("OLM's replace rolled the Deployment out: generation %d -> %d", before.Generation, last.Generation)
	}
	if !equality.Semantic.DeepEqual(last.Spec.Template, before.Spec.Template) {
		t.Errorf("OLM's replace changed the pod template (-before +after):\n%s", cmp.Diff(before.Spec.Template, last.Spec.Template))
	}
	if got, want := last.Annotations[annotations.Status], before.Annotations[annotations.Status]; got != want {
		t.Errorf("status annotation after OLM's replace %q, want %q", got, want)
	}
	var now appsv1.Deployment
	if err := cluster.Client.Get(t.Context(), client.ObjectKeyFromObject(d), &now); err != nil {
		t.Fatal(err)
	}
	if now.ResourceVersion != last.ResourceVersion {
		t.Errorf("resourceVersion %s, the watch saw %s last", now.ResourceVersion, last.ResourceVersion)
	}
}

func nextDeployment(t *testing.T, w watch.Interface, timeout time.Duration) *appsv1.Deployment {
	t.Helper()
	select {
	case ev := <-w.ResultChan():
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			t.Fatalf("unexpected watch event %s %T", ev.Type, ev.Object)
		}
		return d
	case <-time.After(timeout):
		t.Fatalf("no watch event within %s", timeout)
		return nil
	}
}

// webhookReviews scrapes the webhook's reviews with one outcome.
func webhookReviews(t *testing.T, outcome string) float64 {
	t.Helper()
	resp, err := http.Get(webhook.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, m := range mfs["addon_heartbeat_webhook_reviews_total"].GetMetric() {
		if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "outcome" && l.GetValue() == outcome }) {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func logTail(t *testing.T, name, path string, n int) {
	t.Helper()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	t.Logf("last lines of %s:\n%s", name, strings.Join(lines[max(0, len(lines)-n):], "\n"))
}
