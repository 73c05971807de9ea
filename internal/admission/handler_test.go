package admission

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// injectCfg is the injector's configuration the handler tests run with: the
// defaults, an image, and the chart's default AddonInstance name.
var injectCfg = func() inject.Config {
	c := inject.DefaultConfig()
	c.Image = "registry.example.com/addon-heartbeat/reporter:v0.1.0-test"
	c.AddonInstanceNames = []string{"addon-instance"}
	if err := c.Validate(); err != nil {
		panic(err)
	}
	return c
}()

// reviewOf wraps a raw Deployment in an AdmissionReview for CREATE.
func reviewOf(t testing.TB, raw []byte, dryRun bool) []byte {
	t.Helper()
	r := admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{
		UID: "uid-1", Kind: deploymentKind, Resource: deploymentResource, Operation: admissionv1.Create,
		Namespace: "addon-ns", Name: "my-addon", Object: runtime.RawExtension{Raw: raw}, DryRun: &dryRun,
	}}
	r.APIVersion, r.Kind = "admission.k8s.io/v1", "AdmissionReview"
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func serve(t testing.TB, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || rec.Code != http.StatusOK {
		t.Fatalf("status %d, body %s (%v)", rec.Code, rec.Body, err)
	}
	return out.Response
}

// rawWithFutureFields is a Deployment as a newer API server would send it:
// fields our API types do not know, in the Deployment, the pod and a container.
func rawWithFutureFields(t testing.TB, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	spec := m["spec"].(map[string]any)
	spec["futureDeploymentField"] = map[string]any{"enabled": true}
	pod := spec["template"].(map[string]any)["spec"].(map[string]any)
	pod["futurePodField"] = "kept"
	pod["containers"].([]any)[0].(map[string]any)["futureContainerField"] = []any{"a", "b"}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The patch in the response, applied to the raw request object (with fields
// our types do not know), gives the mutated Deployment and keeps those
// fields: the webhook never rewrites what it does not own.
func TestHandlerPatchAppliesToRawRequest(t *testing.T) {
	h := &Handler{Config: injectCfg, Log: logr.Discard()}
	inputs, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "pkg", "inject", "testdata", "input", "*.yaml"))
	if len(inputs) == 0 {
		t.Fatal("no inputs")
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			raw := rawWithFutureFields(t, in)
			resp := serve(t, h, reviewOf(t, raw, false))
			if !resp.Allowed || resp.UID != "uid-1" || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("response %+v", resp)
			}
			p, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatal(err)
			}
			patched, err := p.Apply(raw)
			if err != nil {
				t.Fatal(err)
			}
			var d, got appsv1.Deployment
			_ = json.Unmarshal(raw, &d)
			if err := json.Unmarshal(patched, &got); err != nil {
				t.Fatal(err)
			}
			want, err := inject.Mutate(&d, injectCfg)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(&got, want.Deployment) {
				t.Errorf("patched request differs from the mutated Deployment")
			}
			for _, field := range []string{`"futureDeploymentField":{"enabled":true}`, `"futurePodField":"kept"`, `"futureContainerField":["a","b"]`} {
				if !bytes.Contains(patched, []byte(field)) {
					t.Errorf("patched object lost %s", field)
				}
			}
		})
	}
}

// BenchmarkHandler measures one review of a realistic addon Deployment
// (several containers, probes, env; about 8 KB as an AdmissionReview), from
// request bytes to response bytes, through the same handler the server runs.
func BenchmarkHandler(b *testing.B) {
	for name, annots := range map[string]map[string]string{
		"injected":     {annotations.Inject: "true"},
		"not-opted-in": {},
	} {
		b.Run(name, func(b *testing.B) {
			body := benchReview(b, annots)
			h := &Handler{Config: injectCfg, Log: logr.Discard()}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatal(rec.Body.String())
				}
			}
		})
	}
}

func benchReview(b *testing.B, annots map[string]string) []byte {
	raw := rawWithFutureFields(b, filepath.Join(testenv.RepoRoot(), "pkg", "inject", "testdata", "input", "many-containers.yaml"))
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	meta := m["metadata"].(map[string]any)
	a := map[string]any{"app.kubernetes.io/name": "my-addon", "app.kubernetes.io/version": "v1.0.0"}
	for k, v := range annots {
		a[k] = v
	}
	meta["annotations"] = a
	// Pad with the env and labels a real addon carries, to about 8 KB.
	pod := m["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c := pod["containers"].([]any)[0].(map[string]any)
	env := c["env"].([]any)
	for i := range 40 {
		env = append(env, map[string]any{"name": fmt.Sprintf("ADDON_SETTING_%02d", i), "value": "some-configuration-value"})
	}
	c["env"] = env
	raw, _ = json.Marshal(m)
	return reviewOf(b, raw, false)
}
