package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// OLM_ASSETS names the folder; one without the binary or the CRDs is
// refused with a message that says how to build it.
func TestOLMDir(t *testing.T) {
	tests := map[string]struct {
		files   []string
		missing string
	}{
		"binary and CRDs": {files: []string{"olm", "crds/"}},
		"no CRDs":         {files: []string{"olm"}, missing: "crds"},
		"no binary":       {files: []string{"crds/"}, missing: "olm"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(dir, f)
				var err error
				if strings.HasSuffix(f, "/") {
					err = os.Mkdir(p, 0o755)
				} else {
					err = os.WriteFile(p, nil, 0o755)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("OLM_ASSETS", dir)
			got, err := OLMDir()
			if tc.missing == "" {
				if err != nil || got != dir {
					t.Fatalf("OLMDir() = %q, %v; want %q", got, err, dir)
				}
				return
			}
			if err == nil {
				t.Fatalf("OLMDir() = %q with no %s", got, tc.missing)
			}
			for _, w := range []string{"no " + tc.missing, dir, "hack/olm-binary.sh"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
