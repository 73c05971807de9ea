package testenv

import (
	"path/filepath"
	"testing"
)

// The checkout is found from an absolute source path, and from a -trimpath
// build's module path (make demo's driver) run anywhere inside the checkout;
// a go.mod of another module on the way up is passed over.
func TestRepoRoot(t *testing.T) {
	want, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct{ file, wd string }{
		"source path":                          {file: filepath.Join(want, "internal", "testenv", "testenv.go"), wd: "/"},
		"-trimpath, run at the root":           {file: modulePath + "/internal/testenv/testenv.go", wd: want},
		"-trimpath, run in a package":          {file: modulePath + "/internal/testenv/testenv.go", wd: filepath.Join(want, "internal", "demo")},
		"-trimpath, run inside another module": {file: modulePath + "/internal/testenv/testenv.go", wd: filepath.Join(want, "hack", "tools", "kube-1.37")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := repoRoot(tc.file, tc.wd); got != want {
				t.Errorf("repoRoot(%q, %q) = %q, want %q", tc.file, tc.wd, got, want)
			}
		})
	}
	if got := RepoRoot(); got != want {
		t.Errorf("RepoRoot() = %q, want %q", got, want)
	}
}
