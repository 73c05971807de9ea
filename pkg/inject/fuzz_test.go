package inject

import (
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// FuzzInject feeds arbitrary Deployment JSON to Mutate. Whatever the input,
// Mutate must not panic; when it accepts the input, its patch applied to the
// raw input must give the mutated Deployment, and a second pass must have
// nothing to do. The seed corpus (testdata/input and the cases below) runs
// with every `go test`; `make fuzz` explores further.
func FuzzInject(f *testing.F) {
	for _, in := range inputFiles(f) {
		d := loadDeployment(f, in)
		raw, err := json.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, true)
		f.Add(raw, false)
		injected, err := Mutate(d, testConfig())
		if err != nil {
			f.Fatal(err)
		}
		optedOut := injected.Deployment.DeepCopy()
		optedOut.Annotations["addon-heartbeat.io/inject"] = "false"
		raw, _ = json.Marshal(optedOut)
		f.Add(raw, true)
	}
	for _, s := range []string{
		`{}`,
		`{"metadata":{"annotations":{"addon-heartbeat.io/inject":"true"}}}`,
		`{"metadata":{"annotations":{"addon-heartbeat.io/inject":"true"}},"spec":{"template":{"spec":{"containers":null,"initContainers":[]}}}}`,
		`{"metadata":{"annotations":{"addon-heartbeat.io/inject":"false","addon-heartbeat.io/status":"{\"version\":1,\"sidecar\":\"containers\",\"env\":[\"a\",\"a\"]}"}},"spec":{"template":{"spec":{"containers":[{"name":"a","env":[{"name":"ADDON_TARGET_NAMESPACE","valueFrom":{"fieldRef":{"fieldPath":"metadata.namespace"}}}]}]}}}}`,
		`{"metadata":{"annotations":{"addon-heartbeat.io/inject":"true","addon-heartbeat.io/status":"{\"version\":1,\"sidecar\":\"containers\"}"}},"spec":{"template":{"spec":{"containers":[{"name":"heartbeat-reporter"},{"name":"heartbeat-reporter"}]}}}}`,
	} {
		f.Add([]byte(s), true)
	}

	f.Fuzz(func(t *testing.T, raw []byte, native bool) {
		var d appsv1.Deployment
		if err := json.Unmarshal(raw, &d); err != nil {
			return
		}
		// Work from the canonical encoding: the fuzzer's bytes may hold
		// duplicate keys or case variants that the typed decoder folds.
		canon, err := json.Marshal(&d)
		if err != nil {
			return
		}
		cfg := testConfig()
		cfg.NativeSidecar = native
		res, err := Mutate(&d, cfg)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		pj, err := json.Marshal(res.Patch)
		if err != nil {
			t.Fatal(err)
		}
		p, err := jsonpatch.DecodePatch(pj)
		if err != nil {
			t.Fatalf("invalid patch %s: %v", pj, err)
		}
		patched, err := p.Apply(canon)
		if err != nil {
			// A Deployment whose containers share names is invalid and the
			// API server rejects it; the patch may then not apply cleanly.
			if hasDuplicateNames(&d) {
				return
			}
			t.Fatalf("patch %s does not apply to %s: %v", pj, canon, err)
		}
		var got appsv1.Deployment
		if err := json.Unmarshal(patched, &got); err != nil {
			t.Fatal(err)
		}
		if !hasDuplicateNames(&d) && !equality.Semantic.DeepEqual(&got, res.Deployment) {
			a, _ := yaml.Marshal(&got)
			b, _ := yaml.Marshal(res.Deployment)
			t.Fatalf("patched input differs from the mutated Deployment:\n%s\n---\n%s", a, b)
		}
		again, err := Mutate(res.Deployment, cfg)
		if err != nil {
			if hasDuplicateNames(&d) {
				return
			}
			t.Fatalf("second Mutate failed: %v", err)
		}
		if again.Action != Unchanged && !hasDuplicateNames(&d) {
			t.Fatalf("second Mutate did %s: %v", again.Action, again.Patch)
		}
	})
}

// hasDuplicateNames reports a pod spec the API server would reject: two
// containers (init or regular) with the same name.
func hasDuplicateNames(d *appsv1.Deployment) bool {
	seen := map[string]bool{}
	spec := d.Spec.Template.Spec
	for _, list := range [][]string{names(spec.InitContainers), names(spec.Containers)} {
		for _, n := range list {
			if seen[n] {
				return true
			}
			seen[n] = true
		}
	}
	return false
}

func names(cs []corev1.Container) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
