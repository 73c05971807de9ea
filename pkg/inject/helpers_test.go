package inject

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Image = "registry.example.com/addon-heartbeat/reporter:v0.1.0"
	cfg.RecordKey = []byte("a key for the tests only, 32 b.")
	return cfg
}

func plainConfig() Config {
	cfg := testConfig()
	cfg.NativeSidecar = false
	return cfg
}

func openShift(cfg Config) Config {
	cfg.Platform = OpenShift
	return cfg
}

func loadDeployment(t testing.TB, path string) *appsv1.Deployment {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &d
}

func inputFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "input", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no inputs in testdata/input: %v", err)
	}
	return files
}

// mustMutate is Mutate, checked against MutateInPlace of a copy of d: the
// same action, patch and Deployment, and d itself left as it was.
func mustMutate(t testing.TB, d *appsv1.Deployment, cfg Config) Result {
	t.Helper()
	orig, own := d.DeepCopy(), d.DeepCopy()
	res, err := Mutate(d, cfg)
	if err != nil {
		t.Fatalf("Mutate: %v", err)
	}
	inPlace, err := MutateInPlace(own, cfg)
	if err != nil {
		t.Fatalf("MutateInPlace: %v", err)
	}
	if !equality.Semantic.DeepEqual(d, orig) {
		t.Errorf("Mutate changed its input")
	}
	if inPlace.Action != res.Action || !reflect.DeepEqual(inPlace.Patch, res.Patch) ||
		!equality.Semantic.DeepEqual(inPlace.Deployment, res.Deployment) {
		t.Errorf("MutateInPlace gave %s and patch %v, Mutate %s and patch %v (or other Deployments)",
			inPlace.Action, inPlace.Patch, res.Action, res.Patch)
	}
	return res
}

// applyPatch applies p to raw JSON, as the API server does with the patch in
// an admission response.
func applyPatch(t testing.TB, raw []byte, p Patch) []byte {
	t.Helper()
	pj, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := jsonpatch.DecodePatch(pj)
	if err != nil {
		t.Fatalf("decoding patch %s: %v", pj, err)
	}
	out, err := decoded.Apply(raw)
	if err != nil {
		t.Fatalf("applying patch %s: %v", pj, err)
	}
	return out
}

func toJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fromJSON(t testing.TB, b []byte) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}
