package webhook

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// olmHashLabel is the label in which OLM keeps the hash of the Deployment it
// built from the CSV; it compares the hash with the CSV's, never with the
// live spec, so an admission-time sidecar survives.
const olmHashLabel = "olm.deployment-spec-hash"

// csvDeployment is a Deployment as OLM builds it from a CSV's install
// strategy: the CSV's labels and pod template, OLM's own labels and
// pod-template annotations, no metadata annotations at all.
func csvDeployment(ns, name, hash string, optIn func(*appsv1.Deployment)) *appsv1.Deployment {
	d := addon(ns, name, nil)
	d.Labels = map[string]string{olmHashLabel: hash, "olm.managed": "true", "olm.owner": "my-addon.v1.0.0",
		"olm.owner.kind": "ClusterServiceVersion", "olm.owner.namespace": ns}
	d.Spec.Template.Annotations = map[string]string{"olm.operatorGroup": "my-addon", "olm.operatorNamespace": ns, "olm.targetNamespaces": ns}
	optIn(d)
	return d
}

// OLM can set Deployment labels and pod-template annotations, not Deployment
// annotations. Either opt-in form is injected exactly as the annotation is;
// OLM's update with a freshly built object (its metadata annotations, so our
// status record, replaced; the CSV's pod template without the sidecar) leaves
// the Deployment as it was: same generation (no rollout), same pod template,
// the hash label untouched. A new CSV version rolls out once.
func TestOLMStyleOptInAndReplace(t *testing.T) {
	forms := map[string]func(*appsv1.Deployment){
		"Deployment label":        func(d *appsv1.Deployment) { d.Labels[annotations.Inject] = "true" },
		"pod template annotation": func(d *appsv1.Deployment) { d.Spec.Template.Annotations[annotations.Inject] = "true" },
	}
	for name, optInBy := range forms {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t)
			built := csvDeployment(ns, "addon-operator", "hash-v1", optInBy)
			if err := k8s.Create(t.Context(), built.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			first := get(t, ns, "addon-operator")
			annotated := addon(ns, "by-annotation", optIn())
			if err := k8s.Create(t.Context(), annotated); err != nil {
				t.Fatal(err)
			}
			got, _ := reporterOf(first)
			want, _ := reporterOf(get(t, ns, "by-annotation"))
			if got == nil || !equality.Semantic.DeepEqual(got, want) {
				t.Fatalf("reporter injected by %s differs from the annotation's:\n got %+v\nwant %+v", name, got, want)
			}
			if first.Annotations[annotations.Status] == "" {
				t.Errorf("no status record")
			}

			for i := range 2 {
				fresh := built.DeepCopy()
				fresh.ResourceVersion = get(t, ns, "addon-operator").ResourceVersion
				if err := k8s.Update(t.Context(), fresh); err != nil {
					t.Fatalf("OLM's replace %d: %v", i, err)
				}
				now := get(t, ns, "addon-operator")
				if now.Generation != first.Generation || !equality.Semantic.DeepEqual(now.Spec.Template, first.Spec.Template) {
					t.Fatalf("OLM's replace %d changed the Deployment: generation %d -> %d", i, first.Generation, now.Generation)
				}
				if now.Labels[olmHashLabel] != "hash-v1" || now.Annotations[annotations.Status] != first.Annotations[annotations.Status] {
					t.Errorf("after replace %d: hash label %q, status %q", i, now.Labels[olmHashLabel], now.Annotations[annotations.Status])
				}
			}

			// The CSV's next version: a new image and hash. One rollout,
			// still with the reporter.
			next := csvDeployment(ns, "addon-operator", "hash-v2", optInBy)
			next.Spec.Template.Spec.Containers[0].Image = "registry.example.com/my-addon:v1.1.0"
			next.ResourceVersion = get(t, ns, "addon-operator").ResourceVersion
			if err := k8s.Update(t.Context(), next); err != nil {
				t.Fatal(err)
			}
			upgraded := get(t, ns, "addon-operator")
			if c, _ := reporterOf(upgraded); c == nil || upgraded.Generation != first.Generation+1 || upgraded.Labels[olmHashLabel] != "hash-v2" {
				t.Errorf("after the upgrade: reporter %v, generation %d (was %d), hash %q", c != nil, upgraded.Generation, first.Generation, upgraded.Labels[olmHashLabel])
			}
		})
	}
}

// A key set in two places with different values is denied with both places
// and values named.
func TestConflictingOptInDenied(t *testing.T) {
	ns := newNamespace(t)
	d := addon(ns, "conflicting", map[string]string{annotations.Inject: "false"})
	d.Labels = map[string]string{annotations.Inject: "true"}
	err := k8s.Create(t.Context(), d)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("create: got %v, want a denial", err)
	}
	for _, s := range []string{annotations.Inject, `"false" in the Deployment's annotations`, `"true" in the Deployment's labels`, "set it in one place"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("denial %q does not name %q", err, s)
		}
	}
}
