package release

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

const changelog = `# Changelog

Intro.

## [v0.2.0] - 2026-12-04

### Added

- releases

## v0.1.0

- the first
`

func TestNotes(t *testing.T) {
	tests := map[string]struct {
		changelog, version string
		want               string
		wantErr            string
	}{
		"newest":               {changelog: changelog, version: "v0.2.0", want: "### Added\n\n- releases\n"},
		"oldest, no date":      {changelog: changelog, version: "v0.1.0", want: "- the first\n"},
		"missing":              {changelog: changelog, version: "v0.3.0", wantErr: `CHANGELOG.md has no section for v0.3.0: add a heading "## [v0.3.0] - YYYY-MM-DD"`},
		"empty section":        {changelog: "## [v0.3.0]\n\n## [v0.2.0]\n- x\n", version: "v0.3.0", wantErr: "the section for v0.3.0 is empty"},
		"a prefix is no match": {changelog: "## [v0.2.0-rc.1]\n- rc\n", version: "v0.2.0", wantErr: "no section for v0.2.0"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Notes([]byte(tt.changelog), tt.version)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Notes = %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Notes = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// The repository's CHANGELOG.md has a section for each version, and its
// newest is the chart's appVersion: the version a release of this checkout
// is.
func TestRepositoryChangelog(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	latest, err := Latest(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v0.1.0", latest} {
		if _, err := Notes(data, v); err != nil {
			t.Error(err)
		}
	}
	chartYAML, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "addon-heartbeat", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "appVersion: \"" + latest + "\""; !strings.Contains(string(chartYAML), want) {
		t.Errorf("Chart.yaml lacks %s, the newest version in CHANGELOG.md", want)
	}
}
