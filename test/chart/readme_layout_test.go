package chart_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// README's Layout names every folder of code (those under cmd/, pkg/,
// internal/ and test/, and the SDK's packages), and every folder it names
// exists.
func TestREADMELayoutMatchesTheTree(t *testing.T) {
	root := testenv.RepoRoot()
	section := readmeSection(t, "Layout")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`\b((?:cmd|pkg|internal|test|hack|charts|config|examples)/(?:[a-z0-9-]+/)*)`).FindAllString(section, -1) {
		named[strings.TrimSuffix(m, "/")] = true
	}
	for dir := range named {
		if info, err := os.Stat(filepath.Join(root, dir)); err != nil || !info.IsDir() {
			t.Errorf("Layout names %s/, which is not a folder of the tree", dir)
		}
	}
	var dirs []string
	for _, pattern := range []string{"cmd/*", "pkg/*", "internal/*", "test/*", "pkg/heartbeat/*"} {
		found, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range found {
			rel, _ := filepath.Rel(root, f)
			base := filepath.Base(rel)
			if info, err := os.Stat(f); err != nil || !info.IsDir() || base == "testdata" || rel == "pkg/heartbeat/internal" {
				continue
			}
			dirs = append(dirs, rel)
		}
	}
	if len(dirs) < 20 {
		t.Fatalf("found %d folders of code: %v", len(dirs), dirs)
	}
	for _, dir := range dirs {
		if !named[dir] {
			t.Errorf("README's Layout does not name %s/", dir)
		}
	}
}

// readmeSection is the text of README.md's section (## title) up to the next.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("README.md has no section %s", title)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}
