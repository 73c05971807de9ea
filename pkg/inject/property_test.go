package inject

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// randomDeployment builds an opted-in Deployment with a random mix of init
// containers, native sidecars, containers, env entries (sometimes the user's
// own ADDON_TARGET_NAMESPACE) and envFrom sources.
func randomDeployment(r *rand.Rand) *appsv1.Deployment {
	annots := map[string]string{annotations.Inject: "true", "team": "addons"}
	if r.IntN(2) == 0 {
		annots[annotations.AddonInstance] = fmt.Sprintf("instance-%d", r.IntN(3))
	}
	if r.IntN(3) == 0 {
		annots[annotations.HealthURL] = fmt.Sprintf("http://127.0.0.1:%d/healthz", 8000+r.IntN(100))
	}
	if r.IntN(3) == 0 {
		annots[annotations.DeleteAck] = "manual"
	}
	n := 0
	container := func() corev1.Container {
		n++
		c := corev1.Container{Name: fmt.Sprintf("c%d", n), Image: fmt.Sprintf("img%d:v1", n)}
		for i := range r.IntN(3) {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("VAR_%d", i), Value: "x"})
		}
		switch r.IntN(6) {
		case 0:
			c.Env = append(c.Env, corev1.EnvVar{Name: TargetNamespaceEnv, Value: "user-value"})
		case 1:
			c.Env = slices.Insert(c.Env, 0, targetNamespaceEnv())
		case 2:
			prefix := []string{"", "ADDON_", "DB_"}[r.IntN(3)]
			c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{}})
		}
		if r.IntN(4) == 0 {
			c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
		}
		return c
	}
	d := &appsv1.Deployment{}
	d.Name, d.Namespace, d.Annotations = "addon", "addon-ns", annots
	d.Spec.Replicas = new(int32(int32(r.IntN(4))))
	spec := &d.Spec.Template.Spec
	for range r.IntN(3) {
		c := container()
		if r.IntN(2) == 0 {
			c.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		spec.InitContainers = append(spec.InitContainers, c)
	}
	for range 1 + r.IntN(4) {
		spec.Containers = append(spec.Containers, container())
	}
	return d
}

func randomConfig(r *rand.Rand) Config {
	cfg := testConfig()
	cfg.NativeSidecar = r.IntN(2) == 0
	return cfg
}

const propertyRuns = 300

// TestPropertyIdempotent: injecting twice equals injecting once, for both
// modes and for a mode switch in between.
func TestPropertyIdempotent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range propertyRuns {
		d, cfg := randomDeployment(r), randomConfig(r)
		once := mustMutate(t, d, cfg)
		twice := mustMutate(t, once.Deployment, cfg)
		if twice.Action != Unchanged || len(twice.Patch) != 0 {
			t.Fatalf("run %d: second injection did %s with %v", i, twice.Action, twice.Patch)
		}
		// Switching modes and back ends where a single injection ends.
		other := cfg
		other.NativeSidecar = !cfg.NativeSidecar
		back := mustMutate(t, mustMutate(t, once.Deployment, other).Deployment, cfg)
		if !equality.Semantic.DeepEqual(back.Deployment, once.Deployment) {
			t.Fatalf("run %d: mode switch and back differs from one injection:\n got %s\nwant %s",
				i, toJSON(t, back.Deployment), toJSON(t, once.Deployment))
		}
	}
}

// TestPropertyOptOutRestores: inject, then opt out (with "false" or by
// removing the annotation), gives back the original Deployment.
func TestPropertyOptOutRestores(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range propertyRuns {
		d, cfg := randomDeployment(r), randomConfig(r)
		inj := mustMutate(t, d, cfg).Deployment.DeepCopy()
		want := d.DeepCopy()
		if r.IntN(2) == 0 {
			inj.Annotations[annotations.Inject] = "false"
			want.Annotations[annotations.Inject] = "false"
		} else {
			delete(inj.Annotations, annotations.Inject)
			delete(want.Annotations, annotations.Inject)
		}
		res := mustMutate(t, inj, cfg)
		if res.Action != Removed {
			t.Fatalf("run %d: action %s, want removed", i, res.Action)
		}
		if !equality.Semantic.DeepEqual(res.Deployment, want) {
			t.Fatalf("run %d: opt-out did not restore the original:\n got %s\nwant %s", i, toJSON(t, res.Deployment), toJSON(t, want))
		}
	}
}

// ownedPath matches every path the injector may patch.
var ownedPath = regexp.MustCompile(`^(/metadata/annotations/addon-heartbeat\.io~1status` +
	`|/spec/template/spec/(initContainers|containers)(/[0-9]+|/-)?` +
	`|/spec/template/spec/(initContainers|containers)/[0-9]+/env(/[0-9]+|/-)?)$`)

// TestPropertyOwnedPathsOnly: the patch touches only owned paths; user
// containers keep their order and every field, gaining at most our one env
// entry at the end; nothing else in the Deployment changes.
func TestPropertyOwnedPathsOnly(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range propertyRuns {
		d, cfg := randomDeployment(r), randomConfig(r)
		res := mustMutate(t, d, cfg)
		for _, op := range res.Patch {
			if !ownedPath.MatchString(op.Path) {
				t.Fatalf("run %d: patch touches %s %s, not a path the injector owns", i, op.Op, op.Path)
			}
		}
		out := res.Deployment
		for _, l := range []struct{ in, out []corev1.Container }{
			{d.Spec.Template.Spec.InitContainers, out.Spec.Template.Spec.InitContainers},
			{d.Spec.Template.Spec.Containers, out.Spec.Template.Spec.Containers},
		} {
			user := slices.DeleteFunc(slices.Clone(l.out), func(c corev1.Container) bool { return c.Name == ContainerName })
			if len(user) != len(l.in) {
				t.Fatalf("run %d: %d user containers became %d", i, len(l.in), len(user))
			}
			for j, c := range l.in {
				got := user[j]
				if len(got.Env) == len(c.Env)+1 {
					if !isInjectedTargetEnv(got.Env[len(got.Env)-1]) {
						t.Fatalf("run %d: container %s gained env %v", i, c.Name, got.Env[len(got.Env)-1])
					}
					got.Env = got.Env[:len(got.Env)-1]
				}
				if !equality.Semantic.DeepEqual(got, c) {
					t.Fatalf("run %d: user container changed:\n got %s\nwant %s", i, toJSON(t, got), toJSON(t, c))
				}
			}
		}
		// Outside the container lists and our annotation, nothing differs.
		a, b := d.DeepCopy(), out.DeepCopy()
		for _, x := range []*appsv1.Deployment{a, b} {
			x.Spec.Template.Spec.InitContainers, x.Spec.Template.Spec.Containers = nil, nil
			delete(x.Annotations, annotations.Status)
		}
		if !equality.Semantic.DeepEqual(a, b) {
			t.Fatalf("run %d: fields outside the owned paths changed", i)
		}
	}
}

// TestPropertyPatchMatchesRawRequest applies the patch to the raw JSON of the
// request, which carries fields this package's API types do not know (as a
// newer API server would send), and checks that the result decodes to the
// mutated Deployment and still carries every unknown field.
func TestPropertyPatchMatchesRawRequest(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for i := range propertyRuns {
		d, cfg := randomDeployment(r), randomConfig(r)
		if r.IntN(2) == 0 {
			// Start from an already injected Deployment (possibly in the
			// other mode), so that replace and remove paths are exercised.
			other := randomConfig(r)
			other.Image = "registry.example.com/addon-heartbeat/reporter:old"
			d = mustMutate(t, d, other).Deployment
			if r.IntN(2) == 0 {
				d.Annotations[annotations.Inject] = "false"
			}
		}
		raw := withUnknownFields(t, toJSON(t, d))
		res := mustMutate(t, fromJSON(t, raw), cfg)
		patched := applyPatch(t, raw, res.Patch)
		if got := fromJSON(t, patched); !equality.Semantic.DeepEqual(got, res.Deployment) {
			t.Fatalf("run %d: patched request differs from the mutated Deployment:\n got %s\nwant %s", i, toJSON(t, got), toJSON(t, res.Deployment))
		}
		var m map[string]any
		if err := json.Unmarshal(patched, &m); err != nil {
			t.Fatal(err)
		}
		spec := m["spec"].(map[string]any)
		pod := spec["template"].(map[string]any)["spec"].(map[string]any)
		if spec["futureDeploymentField"] != "kept" || pod["futurePodField"] != "kept" {
			t.Fatalf("run %d: unknown fields were lost: %s", i, patched)
		}
		for _, c := range pod["containers"].([]any) {
			c := c.(map[string]any)
			if c["name"] != ContainerName && c["futureContainerField"] != "kept" {
				t.Fatalf("run %d: unknown container field lost in %v", i, c["name"])
			}
		}
	}
}

// withUnknownFields adds fields to the raw Deployment that no version of the
// API types knows: in the Deployment spec, the pod spec and each container.
func withUnknownFields(t *testing.T, raw []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	spec := m["spec"].(map[string]any)
	spec["futureDeploymentField"] = "kept"
	pod := spec["template"].(map[string]any)["spec"].(map[string]any)
	pod["futurePodField"] = "kept"
	for _, c := range pod["containers"].([]any) {
		c.(map[string]any)["futureContainerField"] = "kept"
	}
	return toJSON(t, m)
}
