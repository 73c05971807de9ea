package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestGet(t *testing.T) {
	vcs := func(modified string) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261204002612-2f4a617abcde"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "2f4a617abcdef"}, {Key: "vcs.modified", Value: modified},
				{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"}}}
	}
	tests := map[string]struct {
		stampedVersion, stampedRevision string
		bi                              *debug.BuildInfo
		want                            Info
	}{
		"release build: the stamped version wins": {
			stampedVersion: "v0.2.0", stampedRevision: "abc", bi: vcs("false"),
			want: Info{Version: "v0.2.0", Revision: "abc", GoVersion: "go1.26.8", Platform: "linux/arm64"},
		},
		"go build in a checkout: the VCS pseudo-version": {
			bi:   vcs("false"),
			want: Info{Version: "v0.0.0-20261204002612-2f4a617abcde", Revision: "2f4a617abcdef", GoVersion: "go1.26.8", Platform: "linux/arm64"},
		},
		"a modified tree says so": {
			bi:   vcs("true"),
			want: Info{Version: "v0.0.0-20261204002612-2f4a617abcde", Revision: "2f4a617abcdef-dirty", GoVersion: "go1.26.8", Platform: "linux/arm64"},
		},
		"go test: devel": {
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			want: Info{Version: Devel, GoVersion: "go1.26.8"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := get(tt.stampedVersion, tt.stampedRevision, tt.bi)
			if tt.want.Platform == "" {
				tt.want.Platform = got.Platform // the test binary's own
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLDFlags(t *testing.T) {
	got := LDFlags("v1.2.3", "abc")
	want := "-X github.com/addon-heartbeat/addon-heartbeat/internal/version.version=v1.2.3 -X github.com/addon-heartbeat/addon-heartbeat/internal/version.revision=abc"
	if got != want {
		t.Errorf("LDFlags: %q, want %q", got, want)
	}
	if got := LDFlags("", ""); got != "" {
		t.Errorf("LDFlags of nothing: %q", got)
	}
}

func TestImageVersion(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := map[string]struct {
		ref  string
		want string
		ok   bool
	}{
		"tag":                          {"ghcr.io/addon-heartbeat/addon-heartbeat:v0.2.0", "v0.2.0", true},
		"tag and digest":               {"ghcr.io/addon-heartbeat/addon-heartbeat:v0.2.0@" + digest, "v0.2.0", true},
		"pre-release":                  {"mirror.example.com:5000/ahb:v1.3.0-rc.1", "v1.3.0-rc.1", true},
		"digest alone":                 {"ghcr.io/addon-heartbeat/addon-heartbeat@" + digest, "", false},
		"registry port, no tag":        {"mirror.example.com:5000/addon-heartbeat", "", false},
		"a tag that is no version":     {"ghcr.io/addon-heartbeat/addon-heartbeat:node-1", "node-1", false},
		"a version without its v":      {"ghcr.io/addon-heartbeat/addon-heartbeat:0.2.0", "0.2.0", false},
		"no tag at all (latest)":       {"addon-heartbeat", "", false},
		"a version with leading zeros": {"x:v01.2.3", "v01.2.3", false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := ImageVersion(tt.ref)
			if got != tt.want || ok != tt.ok {
				t.Errorf("ImageVersion(%q) = %q, %t; want %q, %t", tt.ref, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestReporterMismatch(t *testing.T) {
	const repo = "ghcr.io/addon-heartbeat/addon-heartbeat"
	tests := map[string]struct {
		webhook, reporter, image string
		mismatch                 bool
		known                    bool
	}{
		"same release":                           {"v0.2.0", "", repo + ":v0.2.0", false, true},
		"same release, by digest, declared":      {"v0.2.0", "v0.2.0", repo + "@sha256:aa", false, true},
		"an older reporter":                      {"v0.2.0", "", repo + ":v0.1.0", true, true},
		"an older reporter by digest, declared":  {"v0.2.0", "v0.1.0", repo + "@sha256:aa", true, true},
		"the declared version wins over the tag": {"v0.2.0", "v0.1.0", repo + ":v0.2.0", true, true},
		"a development webhook":                  {"v0.0.0-20261204002612-2f4a617abcde", "", repo + ":v0.2.0", true, true},
		"webhook of unknown version":             {Devel, "", repo + ":v0.1.0", false, false},
		"reporter by digest alone":               {"v0.2.0", "", repo + "@sha256:aa", false, false},
		"reporter tag that is no version":        {"v0.2.0", "", repo + ":main", false, false},
		"declared version that is no version":    {"v0.2.0", "main", repo + ":v0.1.0", false, false},
		"pre-release differs from release":       {"v0.2.0", "", repo + ":v0.2.0-rc.1", true, true},
		"build metadata differs, it counts":      {"v0.2.0+a", "", repo + ":v0.2.0+b", true, true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			msg, known := ReporterMismatch(tt.webhook, tt.reporter, tt.image)
			if (msg != "") != tt.mismatch || known != tt.known {
				t.Fatalf("ReporterMismatch(%q, %q, %q) = %q, %t", tt.webhook, tt.reporter, tt.image, msg, known)
			}
			if tt.mismatch && (!strings.Contains(msg, tt.image) || !strings.Contains(msg, tt.webhook)) {
				t.Errorf("the message does not name the image and the webhook's version: %s", msg)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector("reporter", Info{Version: "v0.2.0", Revision: "abc", GoVersion: "go1.26.8", Platform: "linux/arm64"}))
	want := `
# HELP addon_heartbeat_build_info The running build: version, revision, Go version and platform, with value 1.
# TYPE addon_heartbeat_build_info gauge
addon_heartbeat_build_info{component="reporter",goversion="go1.26.8",platform="linux/arm64",revision="abc",version="v0.2.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), BuildInfoName); err != nil {
		t.Error(err)
	}
}
