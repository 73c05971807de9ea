package demo

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// The demo, as `make demo` runs it but shorter: every step completes, the
// injected diff and the provisioned RBAC are shown, heartbeats arrive and
// follow the Deployment's availability, and nothing is left behind.
func TestDemo(t *testing.T) {
	// A temporary folder of its own, to see that the demo removes its files.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var out bytes.Buffer
	if err := Run(t.Context(), Options{Duration: 12 * time.Second, Period: time.Second}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		"name: heartbeat-reporter",
		"addon-heartbeat.io/status",
		"RoleBinding my-addon/addon-heartbeat-reporter binds ServiceAccount my-addon-operator",
		"command: /reporter --addon-instance=addon-instance",
		"ADDON_TARGET_NAMESPACE=my-addon",
		"False Blocked",
		"True SetupComplete",
		"True DeploymentUnavailable: my-addon-operator 0/1 available",
		"False AllComponentsAvailable",
		"Stopping everything the demo started",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, text)
		}
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("the demo left %s behind", e.Name())
	}
}
