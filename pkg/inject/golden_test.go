package inject

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Regenerate with: go test ./pkg/inject -run TestGolden -update
var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden from the current output")

// goldenModes are the injector configurations every input is rendered with.
// Files are <input>.<mode>.yaml and <input>.<mode>.patch.json.
var goldenModes = map[string]Config{
	"native":           testConfig(),
	"plain":            plainConfig(),
	"openshift-native": openShift(testConfig()),
	"openshift-plain":  openShift(plainConfig()),
}

// TestGolden renders every input in testdata/input in every mode and compares
// the injected Deployment and the JSON patch with testdata/golden. Goldens
// without an input are reported as stale.
func TestGolden(t *testing.T) {
	want := map[string]bool{}
	for _, in := range inputFiles(t) {
		base := strings.TrimSuffix(filepath.Base(in), ".yaml")
		for mode, cfg := range goldenModes {
			name := base + "." + mode
			t.Run(name, func(t *testing.T) {
				res := mustMutate(t, loadDeployment(t, in), cfg)
				if res.Action != Injected {
					t.Fatalf("action = %s, want %s", res.Action, Injected)
				}
				out, err := yaml.Marshal(res.Deployment)
				if err != nil {
					t.Fatal(err)
				}
				patch, err := json.MarshalIndent(res.Patch, "", "  ")
				if err != nil {
					t.Fatal(err)
				}
				compareGolden(t, filepath.Join("testdata", "golden", name+".yaml"), out)
				compareGolden(t, filepath.Join("testdata", "golden", name+".patch.json"), append(patch, '\n'))
			})
			want[name+".yaml"], want[name+".patch.json"] = true, true
		}
	}

	have, err := os.ReadDir(filepath.Join("testdata", "golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range have {
		if want[e.Name()] {
			continue
		}
		path := filepath.Join("testdata", "golden", e.Name())
		if *update {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("stale golden file %s has no input; run with -update to remove it", path)
	}
}

func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		i := 0
		for i < min(len(gl), len(wl)) && gl[i] == wl[i] {
			i++
		}
		t.Errorf("%s differs from the output first at line %d:\n got: %q\nwant: %q\n(run with -update if the change is intended)",
			path, i+1, at(gl, i), at(wl, i))
	}
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "<end of file>"
}

// TestGoldenDeterministic renders each input many times: the bytes never
// change (map iteration order must not leak into the output).
func TestGoldenDeterministic(t *testing.T) {
	for _, in := range inputFiles(t) {
		var first []byte
		for range 20 {
			res := mustMutate(t, loadDeployment(t, in), testConfig())
			got := slices.Concat(toJSON(t, res.Deployment), toJSON(t, res.Patch))
			if first == nil {
				first = got
			} else if !bytes.Equal(first, got) {
				t.Fatalf("%s: output differs between runs", in)
			}
		}
	}
}
