package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// reapplyManifests are Deployments as their owners write them: every field
// that the API server defaults is left out, since which fields a release
// defaults, and how, differs from one Kubernetes minor to the next. NAME is
// replaced by the Deployment's name.
var reapplyManifests = map[string]string{
	"the fewest fields": `
metadata: {name: NAME, annotations: {addon-heartbeat.io/inject: "true"}}
spec:
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}}
    spec:
      containers: [{name: manager, image: registry.example.com/addon:v1}]`,
	"probes, ports, resources and its own init containers": `
metadata: {name: NAME, annotations: {addon-heartbeat.io/inject: "true", addon-heartbeat.io/health-url: "http://127.0.0.1:8081/healthz"}}
spec:
  replicas: 2
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}}
    spec:
      initContainers:
      - {name: migrate, image: registry.example.com/migrate:v1, args: [--once]}
      - {name: proxy, image: registry.example.com/proxy:v1, restartPolicy: Always}
      containers:
      - name: manager
        image: registry.example.com/addon:latest
        ports: [{containerPort: 8080}, {name: health, containerPort: 8081}]
        env: [{name: LEVEL, value: debug}, {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
        readinessProbe: {httpGet: {path: /readyz, port: 8081}}
        livenessProbe: {tcpSocket: {port: health}}
        resources: {requests: {cpu: 100m, memory: 64Mi}}
        volumeMounts: [{name: tmp, mountPath: /tmp}]
      volumes: [{name: tmp, emptyDir: {}}]`,
	"hostNetwork": `
metadata: {name: NAME, annotations: {addon-heartbeat.io/inject: "true"}}
spec:
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}}
    spec:
      hostNetwork: true
      containers: [{name: agent, image: registry.example.com/agent:v1, ports: [{containerPort: 9100}]}]`,
	"opted in by a label, as OLM writes it": `
metadata: {name: NAME, labels: {addon-heartbeat.io/inject: "true"}}
spec:
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}, annotations: {addon-heartbeat.io/delete-ack: manual}}
    spec:
      containers: [{name: manager, image: registry.example.com/addon:v1}]`,
	"opted in on the pod template": `
metadata: {name: NAME}
spec:
  selector: {matchLabels: {app: NAME}}
  template:
    metadata: {labels: {app: NAME}, annotations: {addon-heartbeat.io/inject: "true"}}
    spec:
      serviceAccountName: default
      securityContext: {runAsNonRoot: true}
      containers: [{name: manager, image: registry.example.com/addon:v1}]`,
}

// reapplyWays are the ways a manifest is applied, creating the Deployment the
// first time and applying the same manifest again after that.
var reapplyWays = map[string]func(ctx context.Context, manifest *unstructured.Unstructured) error{
	// kubectl create, then kubectl replace (a PUT of the manifest).
	"create, then replace": func(ctx context.Context, manifest *unstructured.Unstructured) error {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(manifest.GroupVersionKind())
		err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(manifest), live)
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		o := manifest.DeepCopy()
		if err != nil {
			return cluster.Client.Create(ctx, o)
		}
		o.SetResourceVersion(live.GetResourceVersion())
		return cluster.Client.Update(ctx, o)
	},
	// kubectl apply --server-side.
	"server-side apply": func(ctx context.Context, manifest *unstructured.Unstructured) error {
		return cluster.Client.Patch(ctx, manifest.DeepCopy(), client.Apply, client.FieldOwner("kubectl"), client.ForceOwnership)
	},
	// kubectl apply: a three-way strategic merge patch between the manifest
	// last applied (kept in an annotation), this one and the live object.
	"client-side apply": clientSideApply,
}

const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

func clientSideApply(ctx context.Context, manifest *unstructured.Unstructured) error {
	modified := manifest.DeepCopy()
	applied, err := json.Marshal(manifest.Object)
	if err != nil {
		return err
	}
	annots := modified.GetAnnotations()
	if annots == nil {
		annots = map[string]string{}
	}
	annots[lastApplied] = string(applied)
	modified.SetAnnotations(annots)

	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(manifest.GroupVersionKind())
	err = cluster.Client.Get(ctx, client.ObjectKeyFromObject(manifest), live)
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	if err != nil {
		return cluster.Client.Create(ctx, modified)
	}
	modifiedJSON, err := json.Marshal(modified.Object)
	if err != nil {
		return err
	}
	current, err := json.Marshal(live.Object)
	if err != nil {
		return err
	}
	meta, err := strategicpatch.NewPatchMetaFromStruct(appsv1.Deployment{})
	if err != nil {
		return err
	}
	patch, err := strategicpatch.CreateThreeWayMergePatch([]byte(live.GetAnnotations()[lastApplied]), modifiedJSON, current, meta, true)
	if err != nil {
		return err
	}
	return cluster.Client.Patch(ctx, live, client.RawPatch(types.StrategicMergePatchType, patch))
}

// Must show: applying an injected Deployment's manifest again causes no
// rollout, whichever way it is applied: its generation and pod template stay
// as they were. The matrix (make test-matrix) runs this on each Kubernetes
// minor it covers, since each defaults pod fields its own way.
func TestReapplyCausesNoRollout(t *testing.T) {
	ns := newNamespace(t, "reapply")
	n := 0
	for shape, text := range reapplyManifests {
		for way, apply := range reapplyWays {
			n++
			name := fmt.Sprintf("addon-%d", n)
			t.Run(shape+"/"+way, func(t *testing.T) {
				manifest := &unstructured.Unstructured{}
				if err := yaml.Unmarshal([]byte(strings.ReplaceAll(text, "NAME", name)), &manifest.Object); err != nil {
					t.Fatal(err)
				}
				manifest.SetAPIVersion("apps/v1")
				manifest.SetKind("Deployment")
				manifest.SetNamespace(ns)

				if err := apply(t.Context(), manifest); err != nil {
					t.Fatalf("first apply: %v", err)
				}
				first := getDeployment(t, ns, name)
				if !hasReporter(first) {
					t.Fatalf("not injected: %+v", first.Spec.Template.Spec)
				}
				for i := 1; i <= 2; i++ {
					if err := apply(t.Context(), manifest); err != nil {
						t.Fatalf("apply %d: %v", i+1, err)
					}
					now := getDeployment(t, ns, name)
					if now.Generation != first.Generation {
						t.Errorf("apply %d rolled the Deployment out: generation %d -> %d", i+1, first.Generation, now.Generation)
					}
					if !equality.Semantic.DeepEqual(now.Spec.Template, first.Spec.Template) {
						t.Errorf("apply %d changed the pod template:\n%s", i+1, templateDiff(t, first, now))
					}
				}
			})
		}
	}
}

func getDeployment(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func hasReporter(d *appsv1.Deployment) bool {
	spec := d.Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Name == inject.ContainerName {
			return true
		}
	}
	return false
}

// templateDiff shows the two pod templates' JSON, line by line where they
// differ.
func templateDiff(t *testing.T, a, b *appsv1.Deployment) string {
	t.Helper()
	lines := func(d *appsv1.Deployment) []string {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&d.Spec.Template)
		if err != nil {
			t.Fatal(err)
		}
		out, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(string(out), "\n")
	}
	la, lb := lines(a), lines(b)
	var diff []string
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			diff = append(diff, "- "+x, "+ "+y)
		}
	}
	return strings.Join(diff, "\n")
}
