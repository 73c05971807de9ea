package admission

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// The version warning goes with the reviews that put the reporter into the
// pod template, and with no other.
func TestVersionWarningOnInjection(t *testing.T) {
	const warning = "the injected heartbeat reporter image x:v0.1.0 is version v0.1.0, the webhook is v0.2.0"
	in, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "pkg", "inject", "testdata", "input", "minimal.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.Unmarshal(in, &d); err != nil {
		t.Fatal(err)
	}
	injected, err := inject.Mutate(&d, injectCfg)
	if err != nil {
		t.Fatal(err)
	}
	optedOut := injected.Deployment.DeepCopy()
	optedOut.Annotations[annotations.Inject] = "false"
	tests := map[string]struct {
		deployment *appsv1.Deployment
		warning    string
		want       bool
	}{
		"injected":                      {deployment: &d, warning: warning, want: true},
		"already injected: unchanged":   {deployment: injected.Deployment, warning: warning, want: false},
		"opted out: removed":            {deployment: optedOut, warning: warning, want: false},
		"injected, versions that match": {deployment: &d, warning: "", want: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			h := &Handler{Config: injectCfg, Log: logr.Discard(), VersionWarning: tt.warning}
			raw, err := json.Marshal(tt.deployment)
			if err != nil {
				t.Fatal(err)
			}
			resp := serve(t, h, reviewOf(t, raw, false))
			if !resp.Allowed {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if got := slices.Contains(resp.Warnings, warning); got != tt.want {
				t.Errorf("warnings %q; want the version warning: %t", resp.Warnings, tt.want)
			}
		})
	}
}
