package addon_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/addon-heartbeat/addon-heartbeat/test/sdk/addon/compat"
)

// sdkDir is the SDK module, as go.mod's replace names it.
var sdkDir = filepath.Join("..", "..", "..", "pkg", "heartbeat")

func TestManagerReportsAtTheOldestReleases(t *testing.T) {
	compat.ManagerReports(t)
}

func TestKeepsItsVersions(t *testing.T) {
	compat.KeepsItsVersions(t, ".")
}

// The SDK's module graph holds none of the main module's heavy
// requirements, and what it declares is what this module pins: the oldest
// releases it supports are the ones tested here.
func TestSDKModule(t *testing.T) {
	graph := string(compat.GoCmd(t, sdkDir, "mod", "graph"))
	for _, heavy := range []string{"sigs.k8s.io/controller-runtime", "helm.sh/helm", "sigs.k8s.io/kustomize", "github.com/cert-manager", "github.com/google/go-containerregistry", "github.com/openshift/addon-operator"} {
		if strings.Contains(graph, heavy) {
			t.Errorf("go mod graph of the SDK has %s", heavy)
		}
	}
	sdk, own := compat.ReadModule(t, sdkDir), compat.ReadModule(t, ".")
	if sdk.Go != own.Go {
		t.Errorf("the SDK's go line is %s, this module tests %s", sdk.Go, own.Go)
	}
	for _, path := range compat.Pinned[:3] {
		if sdk.Required(path) != own.Required(path) {
			t.Errorf("the SDK requires %s %s, this module tests %s", path, sdk.Required(path), own.Required(path))
		}
	}
	t.Logf("SDK: go %s, k8s.io/client-go %s, %d lines of go mod graph", sdk.Go, sdk.Required("k8s.io/client-go"), strings.Count(graph, "\n"))
}
